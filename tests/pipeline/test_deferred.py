"""`sync="deferred"`: the skip and clip decided on the device, the host judging one step late.

The run must train exactly as the blocking one (same actions, clip factors, weights, optimizer
state and schedule) where no halt comes, make no blocking transfer in steady state, and say at
which step each event happened."""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from trainguard import Guard, GuardConfig, TrainingDiverged
from trainguard.events import StepReport
from trainguard.transfer import blocking_transfer_count, transfer_count

from ..conftest import Actions, make_setup

QUIET: dict[str, Any] = {"sinks": {"console": False}}


def fused_adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01, fused=True)


@dataclass
class Trained:
    guard: Guard
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    reports: list[StepReport] = field(default_factory=list)
    blocking: list[int] = field(default_factory=list)
    transfers: list[int] = field(default_factory=list)
    weights: list[torch.Tensor] = field(default_factory=list)
    actions: Actions = field(default_factory=Actions)


def train(config: GuardConfig, steps: int = 14, bad: tuple[int, ...] = (),
          spike: tuple[int, ...] = (), make: Any = fused_adamw) -> Trained:
    setup = make_setup()
    optimizer = make(setup.model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / 10))
    actions = Actions()
    guard = Guard(setup.model, optimizer, scheduler, config=config, sinks=[actions])
    out = Trained(guard, optimizer, scheduler, actions=actions)
    for step in range(steps):
        batch = setup.batch()
        loss = setup.model.loss(batch)
        if step in bad:
            loss = loss * math.nan
        if step in spike:
            loss = loss * 50.0
        loss.backward()
        before, blocked = transfer_count(), blocking_transfer_count()
        report = guard.step(loss, batch=batch)
        out.transfers.append(transfer_count() - before)
        out.blocking.append(blocking_transfer_count() - blocked)
        if report is not None:
            out.reports.append(report)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    out.weights = [p.detach().clone() for p in setup.model.parameters()]
    return out


def outcome(report: StepReport) -> tuple[int, str, float, list[tuple[str, int]]]:
    return (report.step, report.action, report.clip_coef,
            [(e.kind, e.step) for e in report.events])


def assert_same_training(one: Trained, other: Trained) -> None:
    for p, q in zip(one.weights, other.weights, strict=True):
        assert torch.equal(p, q)
    for p, q in zip(one.optimizer.param_groups[0]["params"],
                    other.optimizer.param_groups[0]["params"], strict=True):
        mine, theirs = one.optimizer.state[p], other.optimizer.state[q]
        assert mine.keys() == theirs.keys()
        for key in mine:
            assert torch.equal(mine[key], theirs[key]), key
    assert one.scheduler.state_dict() == other.scheduler.state_dict()


@pytest.mark.parametrize("options", [
    {"clip": {"max_grad_norm": 0.5}},
    {},  # the adaptive default clip
    {"clip": {"max_grad_norm": 0.5}, "policy": "observe"},
    {"clip": {"max_grad_norm": None}, "probes": {"sample_every": 4}},
], ids=["fixed_clip", "auto_clip", "observe", "no_clip_sampled"])
def test_deferred_trains_exactly_as_blocking(options: dict[str, Any]) -> None:
    bad = () if options.get("policy") == "observe" else (5, 6)
    blocking = train(GuardConfig(**QUIET, **options), bad=bad)
    deferred = train(GuardConfig(**QUIET, sync="deferred", **options), bad=bad)
    assert deferred.guard.run.deferred and not blocking.guard.run.deferred
    # every step's report comes one call later; the last one is heard by the sinks at close
    assert [outcome(r) for r in deferred.reports] == [outcome(r) for r in blocking.reports[:-1]]
    # the step after an event is sampled, once the event is known: one step later
    every = options.get("probes", {}).get("sample_every", 50)
    after_event = {b + 1 for b in bad}
    assert {r.step for r in blocking.reports if r.sampled} == \
        {s for s in range(14) if s % every == 0} | after_event
    assert {r.step for r in deferred.reports if r.sampled} == \
        {s for s in range(13) if s % every == 0} | {s + 1 for s in after_event if s + 1 < 13}
    assert {a.kind for a in deferred.actions.actions} == {a.kind for a in blocking.actions.actions}
    assert [(a.kind, a.step) for a in deferred.actions.actions] == \
        [(a.kind, a.step) for a in blocking.actions.actions]
    assert [(e.kind, e.step) for e in deferred.guard.events] == \
        [(e.kind, e.step) for e in blocking.guard.events]
    assert_same_training(blocking, deferred)
    if options.get("clip", {}).get("max_grad_norm") == 0.5:
        assert any(r.action == "clipped" for r in deferred.reports)
    if bad:
        assert [r.action for r in deferred.reports if r.step in bad] == ["skipped"] * len(bad)


def test_a_steady_deferred_step_makes_no_blocking_transfer() -> None:
    blocking = train(GuardConfig(**QUIET))
    deferred = train(GuardConfig(**QUIET, sync="deferred"))
    # steps 0 (the first batch inspected in full) and 1 (that step judged) are not steady
    assert blocking.blocking[2:] == [1] * 12
    assert deferred.blocking[2:] == [0] * 12
    assert deferred.transfers[2:] == [1] * 12  # the summary still crosses, without a wait


def test_deferred_events_carry_the_step_they_happened_at() -> None:
    deferred = train(GuardConfig(**QUIET, sync="deferred"), steps=9, bad=(5,))
    by_step = {r.step: r for r in deferred.reports}
    assert by_step[5].action == "skipped"
    assert {e.kind for e in by_step[5].events} >= {"nonfinite_loss", "nonfinite_grad"}
    assert all(e.step == 5 for e in by_step[5].events)
    assert [(a.kind, a.step) for a in deferred.actions.actions] == [("skip", 5)]
    assert [r.step for r in deferred.reports] == list(range(8))  # step 8 judged at close
    assert deferred.guard.global_step == 9


def test_a_deferred_halt_comes_at_the_next_step_with_the_same_events() -> None:
    config = {"policy": "halt", "clip": {"max_grad_norm": 0.5}, **QUIET}
    with pytest.raises(TrainingDiverged) as blocking_halt:
        train(GuardConfig(**config), bad=(5,))
    with pytest.raises(TrainingDiverged) as deferred_halt:
        train(GuardConfig(sync="deferred", **config), bad=(5,))
    report = deferred_halt.value.report
    assert report is not None and blocking_halt.value.report is not None
    assert (report.step, report.action) == (5, "halted")  # raised by the call of step 6
    assert {e.kind for e in deferred_halt.value.events} == \
        {e.kind for e in blocking_halt.value.events}


def test_a_deferred_halt_leaves_the_weights_of_the_blocking_halt(tmp_path: Any) -> None:
    """The NaN step was skipped on the device, step 6's gradients dropped: the model holds the
    weights the blocking run halted with."""
    weights = []
    for sync in ("blocking", "deferred"):
        setup = make_setup()
        optimizer = fused_adamw(setup.model.parameters())
        guard = Guard(setup.model, optimizer, config=GuardConfig(
            policy="halt", sync=sync, checkpoints={"snapshot_dir": str(tmp_path / sync)}, **QUIET))
        with pytest.raises(TrainingDiverged) as halt:
            for step in range(9):
                loss = setup.model.loss(setup.batch())
                if step == 5:
                    loss = loss * math.nan
                loss.backward()
                guard.step(loss)
                optimizer.zero_grad(set_to_none=True)
        assert halt.value.snapshot_path is not None
        weights.append([p.detach().clone() for p in setup.model.parameters()])
    for p, q in zip(*weights, strict=True):
        assert torch.equal(p, q)


def test_the_state_dict_judges_the_last_step_first() -> None:
    setup = make_setup()
    optimizer = fused_adamw(setup.model.parameters())
    guard = Guard(setup.model, optimizer, config=GuardConfig(sync="deferred", **QUIET))
    for _ in range(3):
        setup.model.loss(setup.batch()).backward()
        guard.step(setup.model.loss(setup.batch()).detach())
        optimizer.zero_grad(set_to_none=True)
    assert guard.run.state.step == 2 and guard.global_step == 3
    state = guard.state_dict()
    assert state["step"] == 3 and guard.run.state.step == 3 and guard.global_step == 3
    setup.model.loss(setup.batch()).backward()
    report = guard.step(setup.model.loss(setup.batch()).detach())
    assert report is not None and report.step == 2  # judged for the checkpoint, told now
    guard.close()


@pytest.mark.parametrize(("make", "options", "reason"), [
    (lambda p: torch.optim.AdamW(p, lr=1e-3), {}, "cannot skip a step on the device"),
    (lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, fused=True), {},
     "cannot skip a step on the device"),
    (fused_adamw, {"clip": {"rule": {"type": "adaptive"}}}, "clip.rule and clip.agc"),
])
def test_deferred_falls_back_to_blocking_and_says_why_once(
        make: Any, options: dict[str, Any], reason: str,
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        trained = train(GuardConfig(sync="deferred", **QUIET, **options), steps=4, make=make)
    said = [r.message for r in caplog.records if "sync='deferred'" in r.message]
    assert len(said) == 1 and reason in said[0]
    assert not trained.guard.run.deferred
    assert trained.blocking[1:] == [1] * 3


def test_under_the_adaptive_clip_the_alarm_starts_a_step_later() -> None:
    """The one decision that differs: the step that raises a gradient explosion is clipped at
    the backstop, not yet at the run's typical norm; the next steps are clipped alike."""
    blocking = train(GuardConfig(**QUIET), steps=30, spike=(25,))
    deferred = train(GuardConfig(**QUIET, sync="deferred"), steps=30, spike=(25,))
    first = {r.step: r for r in blocking.reports}
    late = {r.step: r for r in deferred.reports}
    alarm = {"grad_explosion", "loss_spike"}
    assert alarm & {e.kind for e in first[25].events}
    assert [outcome(late[s]) for s in range(25)] == [outcome(first[s]) for s in range(25)]
    assert [e.kind for e in late[25].events] == [e.kind for e in first[25].events]
    assert first[25].action == "clipped"
    assert late[25].clip_coef > first[25].clip_coef
    # the alarm clips the steps after it at the typical norm in both modes
    assert late[26].action == first[26].action == "clipped"


def test_a_failing_judgement_or_device_half_never_stops_the_run() -> None:
    setup = make_setup()
    optimizer = fused_adamw(setup.model.parameters())
    guard = Guard(setup.model, optimizer, config=GuardConfig(sync="deferred", **QUIET))
    deferral = guard.run.deferral
    assert deferral is not None

    def failing(name: str, at: int) -> Any:
        stage = next(s for s in deferral.on_device + deferral.late_stages if s.__name__ == name)

        def maybe_fail(ctx: Any, state: Any, services: Any, *results: Any) -> Any:
            if ctx.step == at:
                raise RuntimeError(f"{name} broke")
            return stage(ctx, state, services, *results)

        maybe_fail.__name__ = name
        return maybe_fail

    deferral.late_stages = tuple(failing("detect", 2) if s.__name__ == "detect" else s
                                 for s in deferral.late_stages)
    deferral.on_device = (failing("measure_on_device", 4),)
    reports: dict[int, StepReport | None] = {}
    for step in range(7):
        setup.model.loss(setup.batch()).backward()
        reports[step] = guard.step(setup.model.loss(setup.batch()).detach())
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    failures = [(e.step, e.message) for e in guard.events if e.kind == "monitor_error"]
    assert [step for step, _ in failures] == [2, 4]
    assert "detect broke" in failures[0][1] and "measure_on_device broke" in failures[1][1]
    assert reports[3] is None  # step 2 went as the device decided, unjudged
    unguarded = reports[4]
    assert unguarded is not None and (unguarded.step, unguarded.action) == (4, "applied")
    assert reports[6] is not None and reports[6].step == 5
    assert guard.global_step == 7 and guard.run.state.step == 7


@pytest.mark.parametrize("policy", ["protect", "observe"])
def test_deferred_with_a_grad_scaler_trains_as_blocking(policy: str) -> None:
    """Float16 autocast and a GradScaler: its overflow (inf gradients, finite loss) and a NaN
    loss are skipped as the blocking Guard skips them, and the scale moves alike."""
    runs = []
    for sync in ("blocking", "deferred"):
        setup = make_setup()
        optimizer = fused_adamw(setup.model.parameters())
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: 1 / (1 + k))
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        guard = Guard(setup.model, optimizer, scheduler, scaler, config=GuardConfig(
            policy=policy, sync=sync, clip={"max_grad_norm": 0.5}, **QUIET))  # type: ignore[arg-type]
        reports, scales = [], []
        for step in range(10):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = setup.model.loss(setup.batch())
            if step == 6:
                loss = loss * math.nan
            scaler.scale(loss).backward()
            if step == 3:
                setup.model.head.weight.grad.fill_(math.inf)  # an fp16 overflow
            report = guard.step(loss)
            scales.append(scaler.get_scale())
            if report is not None:
                reports.append(outcome(report))
            optimizer.zero_grad(set_to_none=True)
        guard.close()
        assert guard.run.deferred == (sync == "deferred")
        runs.append((reports, scales, [p.detach().clone() for p in setup.model.parameters()],
                     scheduler.last_epoch))
    (blocking, b_scales, b_weights, b_epoch), (deferred, d_scales, d_weights, d_epoch) = runs
    assert deferred == blocking[:-1]
    assert blocking[3][1] == "skipped"
    assert blocking[6][1] == "skipped"  # its gradients are NaN too: the scaler refuses them
    assert d_scales == b_scales and d_epoch == b_epoch
    assert b_scales[3] == b_scales[2] / 2  # the overflow lowered the scale
    for p, q in zip(b_weights, d_weights, strict=True):
        assert torch.equal(p, q)


def test_a_trainer_that_takes_the_optimizer_step_runs_blocking(
        caplog: pytest.LogCaptureFixture) -> None:
    from trainguard.pipeline import Run

    setup = make_setup()
    optimizer = fused_adamw(setup.model.parameters())
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        run = Run(setup.model, optimizer, config=GuardConfig(sync="deferred", **QUIET))
    run.close()
    assert not run.deferred
    said = [r.message for r in caplog.records if "sync='deferred'" in r.message]
    assert len(said) == 1 and "the trainer takes the optimizer step" in said[0]


def test_a_deferred_run_resumed_from_a_checkpoint_decides_as_the_uninterrupted_one() -> None:
    """The checkpoint's `guard.state_dict()` judges the last step first, so the resumed run
    starts from the same state as the run that went on (NaN steps on both sides of it)."""
    config = GuardConfig(sync="deferred", clip={"max_grad_norm": 0.5}, probes={"sample_every": 4},
                         **QUIET)
    bad = (3, 13)

    def run(steps: range, setup: Any, optimizer: torch.optim.Optimizer, guard: Guard,
            ) -> list[tuple[int, str, float, list[tuple[str, int]]]]:
        out = []
        for step in steps:
            torch.manual_seed(step)
            loss = setup.model.loss(setup.language.batch(8, 17))
            if step in bad:
                loss = loss * math.nan
            loss.backward()
            report = guard.step(loss)
            if report is not None:
                out.append(outcome(report))
            optimizer.zero_grad(set_to_none=True)
        return out

    setup = make_setup(warmup=0)
    optimizer = fused_adamw(setup.model.parameters())
    guard = Guard(setup.model, optimizer, config=config)
    whole = run(range(18), setup, optimizer, guard)
    guard.close()
    whole_weights = [p.detach().clone() for p in setup.model.parameters()]

    setup = make_setup(warmup=0)
    optimizer = fused_adamw(setup.model.parameters())
    guard = Guard(setup.model, optimizer, config=config)
    first = run(range(9), setup, optimizer, guard)
    saved = (copy.deepcopy(setup.model.state_dict()), copy.deepcopy(optimizer.state_dict()),
             guard.state_dict(), copy.deepcopy(setup.language))
    guard.close()
    resumed = make_setup(warmup=0)
    resumed.model.load_state_dict(saved[0])
    resumed.language = saved[3]
    optimizer = fused_adamw(resumed.model.parameters())
    optimizer.load_state_dict(saved[1])
    guard = Guard(resumed.model, optimizer, config=config, resume=True)
    guard.load_state_dict(saved[2])
    second = run(range(9, 18), resumed, optimizer, guard)
    guard.close()
    # step 8, judged for the checkpoint, was reported to the sinks, not by a later guard.step
    assert first + second == [r for r in whole if r[0] != 8]
    for p, q in zip(whole_weights, resumed.model.parameters(), strict=True):
        assert torch.equal(p, q)
