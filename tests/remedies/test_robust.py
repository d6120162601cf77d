"""The adaptive default clip (`max_grad_norm="auto"`): healthy steps untouched, outliers clipped,
a fixed limit honoured bit for bit, and the state carried through checkpoints."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from trainguard import ConfigError, Guard, GuardConfig, UsageError
from trainguard.remedies.robust import RobustClipLimit

QUIET = {"sinks": {"console": False}, "probes": {"preflight": False}}


def _classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))


def _batch(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    # inputs of scale 10: the healthy global norm sits well above 1, where a fixed clip at
    # 1.0 would clip every step
    return torch.randn(32, 8, generator=generator) * 10, torch.randint(0, 4, (32,),
                                                                        generator=generator)


def _train(config: GuardConfig, steps: int = 200, outlier_at: int | None = None,
           model: nn.Module | None = None) -> tuple[nn.Module, list]:
    model = model if model is not None else _classifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    guard = Guard(model, optimizer, config=config)
    generator = torch.Generator().manual_seed(1)
    reports = []
    for step in range(steps):
        x, y = _batch(generator)
        loss = nn.functional.cross_entropy(model(x), y)
        if step == outlier_at:
            loss = loss * 1000.0  # one step with a gradient 1000x the usual
        loss.backward()
        reports.append(guard.step(loss))
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    return model, reports


def test_the_default_is_the_adaptive_clip() -> None:
    config = GuardConfig()
    assert config.clip.max_grad_norm == "auto" and config.adaptive_clip
    assert config.clip.fixed is None
    assert not GuardConfig(policy="observe").adaptive_clip, "observe never clips by default"
    assert GuardConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("bad", ["Auto", "1.0", [1.0], True, 0.0, -1.0, math.inf])
def test_max_grad_norm_takes_a_positive_number_auto_or_none(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"^clip\.max_grad_norm"):
        GuardConfig(clip={"max_grad_norm": bad})  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_healthy_run_is_never_clipped() -> None:
    _, reports = _train(GuardConfig(**QUIET))
    assert min(r.grad_norm for r in reports) > 1.0, "a fixed clip at 1.0 would clip every step"
    assert [r.clip_coef for r in reports] == [1.0] * len(reports)
    assert {r.action for r in reports} == {"applied"}


@pytest.mark.slow
def test_an_outlier_step_is_clipped_to_the_runs_own_scale() -> None:
    _, reports = _train(GuardConfig(**QUIET), outlier_at=150)
    outlier = reports[150]
    typical = sorted(r.grad_norm for r in reports[100:150])[25]
    assert outlier.action == "clipped" and outlier.grad_norm > 300 * typical
    clipped_to = outlier.grad_norm * outlier.clip_coef
    assert clipped_to == pytest.approx(typical, rel=0.1), "cut down to the run's typical norm"
    assert all(r.clip_coef == 1.0 for r in reports[:150])
    # the explosion puts the clip in its alarm for 20 steps (at most the typical norm), then
    # healthy steps are left alone again
    assert all(r.grad_norm * r.clip_coef <= 1.01 * typical for r in reports[151:170])
    assert all(r.clip_coef == 1.0 for r in reports[170:])


def test_the_first_steps_get_a_conservative_limit() -> None:
    rule = RobustClipLimit()
    assert rule.limit(0) == 1000.0, "no norm yet: the guide's absolute limit"
    rule.observe(2.0, rule.limit(0))
    assert rule.limit(1) == pytest.approx(20.0), "warming up: 10x the median so far"
    for _ in range(20):
        rule.observe(2.0, rule.limit(1))
    assert rule.warm and rule.limit(2) == pytest.approx(2.0 * 20), "warm: 20x the typical norm"


def test_the_limit_never_exceeds_the_ceiling_and_non_finite_norms_teach_nothing() -> None:
    rule = RobustClipLimit(GuardConfig(detectors={"grad_explosion": {"abs_threshold": 1000.0}}))
    for _ in range(30):
        rule.observe(800.0, 1e9)
    assert rule.limit(30) == 1000.0
    before = rule.state_dict()
    rule.observe(math.nan, 1000.0)
    rule.observe(math.inf, 1000.0)
    assert rule.state_dict() == before


def test_a_clipped_step_enters_the_baseline_at_its_limit() -> None:
    rule = RobustClipLimit()
    for _ in range(20):
        rule.observe(1.0, rule.limit(0))
    limit = rule.limit(20)
    rule.observe(1e6, limit)
    assert rule.typical() == pytest.approx(1.0)
    assert rule.limit(21) == pytest.approx(limit)


def test_an_instability_clips_at_the_typical_norm_for_a_while() -> None:
    rule = RobustClipLimit(GuardConfig(clip={"auto_alarm_steps": 20}))
    for step in range(20):
        rule.observe(2.0, rule.limit(step))
    relaxed = rule.limit(20)
    rule.alarm(20)
    assert rule.limit(20) == pytest.approx(2.0) and rule.limit(39) == pytest.approx(2.0)
    assert rule.limit(40) == pytest.approx(relaxed)


def test_a_loss_spike_puts_the_guard_in_the_alarm() -> None:
    model = _classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET))
    generator = torch.Generator().manual_seed(1)
    for step in range(60):
        x, y = _batch(generator)
        loss = nn.functional.cross_entropy(model(x), y) * (50.0 if step == 40 else 1.0)
        loss.backward()
        report = guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
        if step == 40:
            assert {"grad_explosion", "loss_spike"} & {e.kind for e in report.events}
            typical = guard.run.state.clip.adaptive.typical()
            assert report.grad_norm * report.clip_coef == pytest.approx(typical, rel=1e-5)
    adaptive = guard.run.state.clip.adaptive
    assert adaptive.alarm_until >= 40 + adaptive.alarm_steps
    guard.close()


def test_the_state_round_trips_through_a_checkpoint() -> None:
    rule = RobustClipLimit()
    for step in range(30):
        rule.observe(1.0 + 0.01 * step, rule.limit(step))
    rule.alarm(29)
    again = RobustClipLimit()
    again.load_state_dict(rule.state_dict())
    assert again.limit(30) == rule.limit(30) and again.alarm_until == rule.alarm_until
    assert again.describe() == rule.describe()
    with pytest.raises(UsageError):
        again.load_state_dict({"baseline": {"values": [math.nan]}})
    with pytest.raises(UsageError):
        again.load_state_dict({"nothing": 1})


def test_the_guards_checkpoint_carries_the_adaptive_clip() -> None:
    model = _classifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET))
    generator = torch.Generator().manual_seed(1)
    for _ in range(30):
        x, y = _batch(generator)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    state = guard.state_dict()
    guard.close()
    resumed = Guard(model, optimizer, config=GuardConfig(**QUIET))
    resumed.load_state_dict(state)
    assert resumed.run.state.clip.adaptive.limit(30) == guard.run.state.clip.adaptive.limit(30)
    resumed.close()


@pytest.mark.parametrize("policy", ["protect", "observe", "recover"])
def test_an_explicit_max_grad_norm_is_honoured_bit_for_bit(policy: str) -> None:
    """The same weights, bit for bit, as the loop with `clip_grad_norm_` and no trainguard."""
    base = _classifier()
    plain, guarded = copy.deepcopy(base), copy.deepcopy(base)
    plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-2)
    guarded_opt = torch.optim.Adam(guarded.parameters(), lr=1e-2)
    guard = Guard(guarded, guarded_opt, config=GuardConfig(policy=policy,
                                                           clip={"max_grad_norm": 0.7}, **QUIET))
    generator = torch.Generator().manual_seed(1)
    clipped = 0
    for _ in range(60):
        x, y = _batch(generator)
        loss = nn.functional.cross_entropy(plain(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.7)
        plain_opt.step()
        plain_opt.zero_grad()
        loss = nn.functional.cross_entropy(guarded(x), y)
        loss.backward()
        clipped += guard.step(loss).action == "clipped"
        guarded_opt.zero_grad()
    guard.close()
    assert clipped == 60
    for (name, ours), theirs in zip(guarded.named_parameters(), plain.parameters(), strict=True):
        assert torch.equal(ours, theirs), name


def test_no_clipping_at_all_with_none() -> None:
    _, reports = _train(GuardConfig(clip={"max_grad_norm": None}, **QUIET), steps=60, outlier_at=50)
    assert [r.clip_coef for r in reports] == [1.0] * 60
