"""Warmup + cosine / linear schedules on real optimizers, checked against transformers' curves."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn
from transformers import (
    get_cosine_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

from trainguard.diagnose.preflight import RunSetup, check_warmup
from trainguard.errors import ConfigError, UsageError
from trainguard.recipes import (
    WarmupSchedule,
    warmup_cosine,
    warmup_cosine_factor,
    warmup_linear,
    warmup_linear_factor,
)

W, T = 10, 100


def make_optimizer(lr: float = 1e-3) -> torch.optim.AdamW:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return torch.optim.AdamW(model.parameters(), lr=lr)


def lrs(scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int) -> list[float]:
    """The LR used by each of the next `steps` updates (scheduler stepped after each)."""
    out = []
    for _ in range(steps):
        out.append(scheduler.optimizer.param_groups[0]["lr"])
        scheduler.optimizer.step()
        scheduler.step()
    return out


def test_cosine_curve_at_known_points() -> None:
    f = lambda s: warmup_cosine_factor(s, warmup_steps=W, total_steps=T)  # noqa: E731
    assert f(0) == pytest.approx(1 / W)  # the first update already moves
    assert f(4) == pytest.approx(5 / W)
    assert f(W - 1) == pytest.approx(1.0)  # peak reached by the last warmup update
    assert f(W) == pytest.approx(1.0)
    assert f((W + T) // 2) == pytest.approx(0.5)  # halfway through the decay
    assert 0 < f(T - 1) < 1e-3  # the last update is small but not wasted
    assert f(T) == 0.0 and f(10 * T) == 0.0  # holds the floor past the end, never rises again


def test_min_lr_ratio_and_warmup_start_ratio() -> None:
    f = lambda s: warmup_cosine_factor(  # noqa: E731
        s, warmup_steps=W, total_steps=T, min_lr_ratio=0.1, warmup_start_ratio=0.5)
    assert f(0) == pytest.approx(0.5 + 0.5 / W)
    assert f(W) == pytest.approx(1.0)
    assert f((W + T) // 2) == pytest.approx(0.55)
    assert f(T) == pytest.approx(0.1) and f(2 * T) == pytest.approx(0.1)


def test_no_warmup_starts_at_peak_and_all_warmup_ends_at_floor() -> None:
    assert warmup_cosine_factor(0, warmup_steps=0, total_steps=T) == 1.0
    assert warmup_cosine_factor(T // 2, warmup_steps=0, total_steps=T) == pytest.approx(0.5)
    only_warmup = [warmup_cosine_factor(s, warmup_steps=4, total_steps=4) for s in range(6)]
    assert only_warmup == pytest.approx([0.25, 0.5, 0.75, 1.0, 0.0, 0.0])


def test_decay_matches_transformers_and_warmup_is_shifted_by_one_update() -> None:
    ours = lrs(warmup_cosine(make_optimizer(), warmup_steps=W, total_steps=T), T)
    theirs = lrs(get_cosine_schedule_with_warmup(make_optimizer(), W, T), T + 1)
    assert ours[W:] == pytest.approx(theirs[W:T])
    assert ours[:W] == pytest.approx(theirs[1:W + 1])  # theirs spends update 0 at LR 0
    assert theirs[0] == 0.0 and ours[0] > 0.0


def test_min_lr_matches_transformers() -> None:
    ours = lrs(warmup_cosine(make_optimizer(), warmup_steps=W, total_steps=T, min_lr_ratio=0.2),
               T)
    theirs = lrs(get_cosine_with_min_lr_schedule_with_warmup(
        make_optimizer(), W, T, min_lr_rate=0.2), T)
    assert ours[W:] == pytest.approx(theirs[W:])


def test_linear_matches_transformers() -> None:
    ours = lrs(warmup_linear(make_optimizer(), warmup_steps=W, total_steps=T), T)
    theirs = lrs(get_linear_schedule_with_warmup(make_optimizer(), W, T), T)
    assert ours[W:] == pytest.approx(theirs[W:])
    assert ours[0] == pytest.approx(1e-3 / W)
    assert warmup_linear_factor((W + T) // 2, warmup_steps=W, total_steps=T) == pytest.approx(0.5)


def test_every_param_group_follows_the_curve_relative_to_its_own_lr() -> None:
    torch.manual_seed(0)
    body, head = nn.Linear(4, 4), nn.Linear(4, 2)
    optimizer = torch.optim.AdamW([{"params": body.parameters(), "lr": 1e-5},
                                   {"params": head.parameters(), "lr": 1e-3}])
    scheduler = warmup_cosine(optimizer, warmup_steps=W, total_steps=T)
    for step in range(30):
        factor = warmup_cosine_factor(step, warmup_steps=W, total_steps=T)
        assert [g["lr"] for g in optimizer.param_groups] == pytest.approx(
            [1e-5 * factor, 1e-3 * factor])
        optimizer.step()
        scheduler.step()


def test_state_dict_round_trip_restores_the_schedule_and_its_position() -> None:
    reference = warmup_cosine(make_optimizer(), warmup_steps=W, total_steps=T, min_lr_ratio=0.1)
    lrs(reference, 37)
    buffer = io.BytesIO()
    torch.save({"optimizer": reference.optimizer.state_dict(),
                "scheduler": reference.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)  # plain numbers only: loads without pickle
    assert saved["scheduler"]["lr_lambdas"][0]["warmup_steps"] == W

    # A resumed script that rebuilds the schedule with other arguments still gets the saved one.
    optimizer = make_optimizer()
    resumed = warmup_cosine(optimizer, warmup_steps=1, total_steps=5)
    optimizer.load_state_dict(saved["optimizer"])
    resumed.load_state_dict(saved["scheduler"])
    assert resumed.lr_lambdas[0].total_steps == T
    assert lrs(resumed, 80) == pytest.approx(lrs(reference, 80))


def test_preflight_sees_the_warmup() -> None:
    optimizer = make_optimizer()
    model = nn.Linear(2, 2)
    assert check_warmup(RunSetup(model, [optimizer],
                                 warmup_cosine(optimizer, warmup_steps=W, total_steps=T))) == []
    no_warmup = make_optimizer()
    findings = check_warmup(RunSetup(model, [no_warmup],
                                     warmup_cosine(no_warmup, warmup_steps=0, total_steps=T)))
    assert [f.check for f in findings] == ["warmup"]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"warmup_steps": 200, "total_steps": 100}, "warmup_steps"),
    ({"warmup_steps": -1, "total_steps": 100}, "warmup_steps"),
    ({"warmup_steps": 2.5, "total_steps": 100}, "warmup_steps"),
    ({"warmup_steps": True, "total_steps": 100}, "warmup_steps"),
    ({"warmup_steps": 0, "total_steps": 0}, "total_steps"),
    ({"warmup_steps": 0, "total_steps": 10, "min_lr_ratio": 1.5}, "min_lr_ratio"),
    ({"warmup_steps": 0, "total_steps": 10, "min_lr_ratio": -0.1}, "min_lr_ratio"),
    ({"warmup_steps": 0, "total_steps": 10, "min_lr_ratio": math.nan}, "min_lr_ratio"),
    ({"warmup_steps": 0, "total_steps": 10, "warmup_start_ratio": math.nan},
     "warmup_start_ratio"),
])
def test_bad_arguments_are_config_errors_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        warmup_cosine(make_optimizer(), **kwargs)
    with pytest.raises(ConfigError, match=field):
        warmup_cosine_factor(0, **kwargs)


def test_bad_optimizer_shape_and_step_are_clear_errors() -> None:
    with pytest.raises(UsageError, match=r"torch\.optim\.Optimizer"):
        warmup_cosine(nn.Linear(2, 2), warmup_steps=1, total_steps=10)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="shape"):
        WarmupSchedule(warmup_steps=1, total_steps=10, shape="step")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="step"):
        warmup_cosine_factor(-1, warmup_steps=1, total_steps=10)
