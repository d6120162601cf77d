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
from trainguard.detect.calm import SignalColumns, run_rows
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


def test_one_positive_step_between_two_stretches_at_zero_does_not_tell_it_again() -> None:
    lrs = [(1e-3,)] * 20 + [(0.0,)] * 30 + [(1e-3,)] + [(0.0,)] * 30
    assert _told(LRAtZero(DetectorConfig()), lrs) == [29]


def test_a_short_stretch_at_the_end_of_a_long_run_leaves_the_verdict_to_the_loss() -> None:
    detector = LRAtZero(DetectorConfig())
    assert _told(detector, [(1e-3,)] * 990 + [(0.0,)] * 60) == [999]
    assert detector.untrained() is None  # 60 of 1050 steps: the run trained most of the way
    assert _told(detector, [(0.0,)] * 60) == []
    assert detector.untrained() == (120, "the LR at 0 in every parameter group")


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


def _run(set_lr: dict[int, float], steps: int, scheduler_steps: int | None = None,
         rprop: bool = False, per_batch_step_lr: bool = False
         ) -> tuple[list[tuple[str, str, int, int]], Guard]:
    """The events (kind, severity, step, and the step whose `guard.step` returned it)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = (torch.optim.Rprop(model.parameters(), lr=1e-3) if rprop
                 else torch.optim.AdamW(model.parameters(), lr=1e-2))
    scheduler = (None if scheduler_steps is None else torch.optim.lr_scheduler.PolynomialLR(
        optimizer, total_iters=scheduler_steps, power=1.0))
    if per_batch_step_lr:  # written for epochs of 10 batches, stepped every batch
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.1)
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
        told += [(e.kind, e.severity, e.step, step) for e in guard.step(loss).events]
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
    guard.close()
    return told, guard


def test_the_loops_own_lr_set_to_zero_is_told_at_once_and_the_run_is_stalled() -> None:
    told, guard = _run({60: 0.0}, 300)
    assert [t for t in told if t[0] == "lr_at_zero"] == [("lr_at_zero", "warning", 69, 69)]
    verdict = guard.verdict
    assert verdict is not None and verdict.verdict == "stalled"
    assert "the LR at 0 in every parameter group from step 60 to the end" in verdict.message
    assert guard.diagnose()[0].code == "lr_at_zero"


def test_a_scheduler_shorter_than_the_run_is_told() -> None:
    told, guard = _run({}, 120, scheduler_steps=60)
    assert [t for t in told if t[0] == "lr_at_zero"] == [("lr_at_zero", "warning", 69, 69)]
    assert guard.verdict is not None and guard.verdict.verdict == "stalled"


def test_a_scheduler_that_ends_with_the_run_is_not() -> None:
    told, guard = _run({}, 120, scheduler_steps=120)
    assert told == []
    assert guard.verdict is not None and guard.verdict.verdict == "healthy"


def test_an_lr_set_back_after_a_pause_is_told_and_the_run_is_no_recovery() -> None:
    told, guard = _run({40: 0.0, 70: 1e-2}, 200)
    assert [t for t in told if t[0] == "lr_at_zero"] == [("lr_at_zero", "warning", 49, 49)]
    assert guard.verdict is not None and guard.verdict.verdict == "healthy"


def test_a_step_schedule_stepped_per_batch_is_told_once_it_has_stayed_faded_as_long() -> None:
    told, guard = _run({}, 300, per_batch_step_lr=True)
    [event] = [t for t in told if t[0] == "lr_at_zero"]
    # at the highest to step 9, under 1e-4 of it from step 40: told 31 steps later, and the
    # same stretch is not told again at 1e-12 (step 139)
    assert event[:3] == ("lr_at_zero", "warning", 70)
    assert guard.verdict is not None and guard.verdict.verdict == "stalled"
    assert "the LR under 1e-12 of its highest in every parameter group from step 130" in (
        guard.verdict.message)
    [message] = [e.message for e in guard.events if e.kind == "lr_at_zero"]
    assert message.startswith("the LR has been under 1e-04 of its highest in every parameter "
                              "group for 31 steps (since step 40")
    assert guard.diagnose()[0].code == "lr_at_zero"


def _schedule(name: str, steps: int) -> list[tuple[float, ...]]:
    """The LRs a scheduler stepped once per optimizer step gives over `steps` steps."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler: torch.optim.lr_scheduler.LRScheduler = {
        "cosine": lambda: torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps),
        "warmup_cosine": lambda: torch.optim.lr_scheduler.SequentialLR(optimizer, [
            torch.optim.lr_scheduler.LinearLR(optimizer, 0.01, total_iters=steps // 10),
            torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps - steps // 10)],
            milestones=[steps // 10]),
        "multistep": lambda: torch.optim.lr_scheduler.MultiStepLR(
            optimizer, [steps // 3, 2 * steps // 3, 8 * steps // 9], gamma=0.1),
        "exponential": lambda: torch.optim.lr_scheduler.ExponentialLR(optimizer, 0.99),
        "cosine_restarts": lambda: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(
            optimizer, steps // 5),
        "per_batch_step": lambda: torch.optim.lr_scheduler.StepLR(optimizer, 30, gamma=0.1),
        "per_batch_exponential": lambda: torch.optim.lr_scheduler.ExponentialLR(
            optimizer, 0.95),
    }[name]()
    lrs = []
    for _ in range(steps):
        lrs.append((optimizer.param_groups[0]["lr"],))
        optimizer.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize("name", ["cosine", "warmup_cosine", "multistep", "exponential",
                                  "cosine_restarts"])
def test_a_schedule_that_decays_over_the_run_is_not_told(name: str) -> None:
    """A cosine spends its last 0.6% under 1e-4 of its peak, three 0.1 decays stop at 1e-3, an
    exponential decay of 0.99 a step over 1000 steps spends its last 83 there after 917."""
    detector = LRAtZero(DetectorConfig())
    assert _told(detector, _schedule(name, 1000)) == []


@pytest.mark.parametrize(("name", "step"), [("per_batch_step", 210),
                                           ("per_batch_exponential", 359)])
def test_a_schedule_written_per_epoch_and_stepped_per_batch_is_told(name: str, step: int) -> None:
    """StepLR(30, 0.1) is at the highest to step 29 and under 1e-4 of it from step 120: told 91
    steps later; ExponentialLR(0.95), under it from step 180, 180 steps later."""
    detector = LRAtZero(DetectorConfig())
    assert _told(detector, _schedule(name, 1000)) == [step]


def test_an_lr_the_loop_cuts_a_million_times_is_told_after_steps() -> None:
    detector = LRAtZero(DetectorConfig())
    assert _told(detector, [(1e-3,)] * 100 + [(1e-9,)] * 50) == [109]


def test_an_lr_set_under_1e12_of_its_highest_is_told_at_its_step() -> None:
    told, _ = _run({60: 1e-15}, 120)
    assert [t for t in told if t[0] == "lr_at_zero"] == [("lr_at_zero", "warning", 69, 69)]


def test_a_negative_lr_is_no_zero() -> None:
    detector = LRAtZero(DetectorConfig())
    assert _told(detector, [(1e-3,)] * 20 + [(-1e-4,)] * 30) == []


def test_rprop_which_the_lr_does_not_hold_back_is_not_judged() -> None:
    told, guard = _run({60: 0.0}, 120, rprop=True)
    assert [t for t in told if t[0] == "lr_at_zero"] == []
    assert guard.verdict is not None and guard.verdict.verdict != "stalled"


@pytest.mark.parametrize("rows", [
    [(1e-3, 1e-3)] * 20 + [(0.0,)] * 100,  # fewer groups than the columns hold: NaN-padded
    [(1e-3,)] * 20 + [(0.0,)] * 5 + [(1e-3,)] * 30 + [(0.0,)] * 40 + [()] * 3 + [(0.0,)] * 9,
    [(10.0 ** -k, 10.0 ** -(k + 1)) for k in range(40)] + [(1e-3, 1e-3)] * 5
    + [(1e-20, 0.0)] * 12 + [(1e-3, math.nan)] * 4 + [(1e-30, 1e-30)] * 12,
    [(1e-2 * 0.1 ** (k // 10),) for k in range(90)] + [(1e-2,)] * 5
    + [(1e-2 * 0.5 ** k,) for k in range(60)] + [(math.nan,)] * 3 + [(1e-7,)] * 20,
], ids=["ragged", "stretches", "tiny", "faded"])
def test_the_fast_path_decides_as_check(rows: list[tuple[float, ...]]) -> None:
    width = max(len(r) for r in rows)
    lrs = np.full((len(rows), width), math.nan)
    for i, row in enumerate(rows):
        lrs[i, :len(row)] = row
    count = len(rows)
    columns = SignalColumns(
        step=np.arange(count), loss=np.ones(count), has_loss=np.ones(count, dtype=bool),
        grad_norm=np.ones(count), amp_overflow=np.zeros(count, dtype=bool), group_lrs=lrs,
        has_lr=np.array([bool(r) for r in rows]), loss_curvature=np.full(count, math.nan),
        has_curvature=np.zeros(count, dtype=bool))
    slow, fast = LRAtZero(DetectorConfig()), LRAtZero(DetectorConfig())
    expected = [(e.step, e.message) for step, row in enumerate(rows)
                for e in slow.check(_signals(step, *row))]
    found = run_rows(fast, columns, lambda i: (i, _signals(i, *rows[i])))
    assert [(e.step, e.message) for _, e in found] == expected != []
    assert fast.state_dict() == slow.state_dict()
