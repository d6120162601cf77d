"""`lr_at_zero`: every group's LR held at exactly 0 after it was positive is told once, after
`steps` steps in a row, and a run that ends so is stalled from its first step at 0; a warm-up
from 0, a step at 0, one group at 0 beside others that train are not."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from trainguard import Guard, GuardConfig
from trainguard.config import DetectorConfig
from trainguard.detect.lr_at_zero import LRAtZero
from trainguard.signals import StepSignals

QUIET = {"sinks": {"console": False}, "probes": {"preflight": False}}


def _signals(step: int, *lrs: float) -> StepSignals:
    return StepSignals(step=step, loss=1.0, grad_norm=1.0, param_grad_norm=np.ones(1),
                       param_names=["w"], lr=lrs[0] if lrs else None, group_lrs=tuple(lrs))


def _told(detector: LRAtZero, lrs: list[tuple[float, ...]]) -> list[int]:
    return [step for step, row in enumerate(lrs) if detector.check(_signals(step, *row))]


def test_ten_steps_at_zero_after_a_positive_lr_are_told_once_per_episode() -> None:
    lrs = [(1e-3,)] * 20 + [(0.0,)] * 30 + [(1e-3,)] * 40 + [(0.0,)] * 12
    detector = LRAtZero(DetectorConfig())
    assert _told(detector, lrs) == [29, 99]
    assert detector.untrained() == (12, "the LR at 0 in every parameter group")


@pytest.mark.parametrize("lrs", [
    [(0.0,)] * 30 + [(1e-3,)] * 10,  # a warm-up that starts at 0
    ([(1e-3,)] * 20 + [(0.0,)] * 9) * 3,  # nine steps at 0 at a time (cycles that touch it)
    [(1e-3, 0.0)] * 50,  # a part frozen by its group's LR 0
    [(1e-3,)] * 20 + [(math.nan,)] * 30,  # a group without an LR says nothing
], ids=["warmup_from_zero", "short_stretches", "one_group", "no_lr"])
def test_what_is_not_told(lrs: list[tuple[float, ...]]) -> None:
    detector = LRAtZero(DetectorConfig())
    assert _told(detector, lrs) == []
    assert detector.untrained() is None


def test_the_state_carries_over_a_resume() -> None:
    first = LRAtZero(DetectorConfig())
    _told(first, [(1e-3,)] * 5 + [(0.0,)] * 6)
    second = LRAtZero(DetectorConfig())
    second.load_state_dict(first.state_dict())
    assert [s for s in range(11, 20) if second.check(_signals(s, 0.0))] == [14]


def _run(set_lr: dict[int, float], steps: int, scheduler_steps: int | None = None
         ) -> tuple[list[tuple[str, str, int]], Guard]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = (None if scheduler_steps is None else torch.optim.lr_scheduler.PolynomialLR(
        optimizer, total_iters=scheduler_steps, power=1.0))
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET))
    x, y = torch.randn(256, 8), torch.randn(256, 1)
    told = []
    for step in range(steps):
        if step in set_lr:
            for group in optimizer.param_groups:
                group["lr"] = set_lr[step]
        i = torch.randint(0, 256, (32,))
        loss = nn.functional.mse_loss(model(x[i]), y[i])
        loss.backward()
        told += [(e.kind, e.severity, e.step) for e in guard.step(loss).events]
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
    guard.close()
    return told, guard


def test_the_loops_own_lr_set_to_zero_is_told_and_the_run_is_stalled() -> None:
    told, guard = _run({60: 0.0}, 150)
    assert ("lr_at_zero", "warning", 69) in told
    verdict = guard.verdict
    assert verdict is not None and verdict.verdict == "stalled"
    assert "the LR at 0 in every parameter group from step 60 to the end" in verdict.message
    assert guard.diagnose()[0].code == "lr_at_zero"


def test_a_scheduler_shorter_than_the_run_is_told() -> None:
    told, guard = _run({}, 120, scheduler_steps=60)
    assert [t for t in told if t[0] == "lr_at_zero"] == [("lr_at_zero", "warning", 69)]
    assert guard.verdict is not None and guard.verdict.verdict == "stalled"


def test_a_scheduler_that_ends_with_the_run_is_not() -> None:
    told, guard = _run({}, 120, scheduler_steps=120)
    assert told == []
    assert guard.verdict is not None and guard.verdict.verdict == "healthy"


def test_an_lr_set_back_after_a_pause_is_told_but_the_run_learned() -> None:
    told, guard = _run({40: 0.0, 70: 1e-2}, 200)
    assert [t for t in told if t[0] == "lr_at_zero"] == [("lr_at_zero", "warning", 49)]
    assert guard.verdict is not None and guard.verdict.verdict != "stalled"
