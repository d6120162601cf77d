"""Steps taken outside `Guard.step`: the loop that still calls `optimizer.step()`, or
`scheduler.step()` on the scheduler it gave the Guard.

`Guard.step` takes the optimizer step itself (with the scheduler's and the GradScaler's). A loop
moved over to trainguard that keeps its own `optimizer.step()` updates twice per batch, the second
time with gradients nobody checked or clipped: nothing fails, the run just trains at about twice
the step size. A post-hook on the optimizer counts every step; the Guard notes the count when its
own step ends, so any step counted before the next `Guard.step` starts was the loop's.

The scheduler handed to the Guard is stepped by `Guard.step` too: a loop that also steps it
runs its schedule at twice the pace (a warmup done in half the steps, a decay that reaches 0
halfway). Its `last_epoch` is noted when the Guard's step ends; moving on by a step or a few
before the next `Guard.step`, `SCHEDULE_STEPS` times in a row, is the loop's (a checkpoint
loaded, a rollback, move it by far more, or back).

Only the plain-loop Guard counts: under a trainer (the HF and Lightning callbacks) the trainer
takes the step, whatever the loop does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from trainguard.events import Event


class OutsideSteps:
    """Counts `optimizer.step()` calls and tells those between two guarded steps."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.calls = 0
        self.at_exit = 0
        """`calls` when the last `Guard.step` returned."""
        self.reported = False
        self._handle: RemovableHandle | None = optimizer.register_step_post_hook(self._count)

    def _count(self, *_: object) -> None:
        self.calls += 1

    def since_last_step(self) -> int:
        """Optimizer steps taken since the last `Guard.step` returned."""
        return self.calls - self.at_exit

    def step_ended(self) -> None:
        self.at_exit = self.calls

    def discount(self, calls: int) -> None:
        """`calls` steps taken since were trainguard's own (a proof's replays)."""
        self.at_exit += calls

    def check(self, step: int) -> Event | None:
        """The warning, the first time steps were taken outside the Guard (once per run)."""
        outside = self.since_last_step()
        if outside <= 0 or self.reported:
            return None
        self.reported = True
        times = "once" if outside == 1 else f"{outside} times"
        return Event(
            kind="optimizer_step_outside", step=step, severity="warning",
            message=(f"optimizer.step() ran {times} outside guard.step before step {step}: "
                     "guard.step takes the optimizer step (and the scheduler's and the "
                     "GradScaler's), so the loop's own call updates again with gradients "
                     "trainguard did not check or clip. Fix: remove the loop's "
                     "optimizer.step()"),
            value=float(outside), details={"calls": outside})

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


SCHEDULE_STEPS = 3
"""Guarded steps in a row before which the scheduler moved on by itself before it is told."""
MOST_MOVED = 4
"""A scheduler stepped by the loop moves on by a step (or one per micro-batch) between two
guarded steps; a loaded checkpoint moves it by far more."""


class OutsideScheduleSteps:
    """Tells a loop that steps the scheduler the Guard steps (once per run)."""

    def __init__(self, scheduler: Any) -> None:
        epoch = getattr(scheduler, "last_epoch", None)
        self.scheduler = scheduler if isinstance(epoch, int) else None
        self.at_exit: int | None = None
        """The scheduler's `last_epoch` when the last `Guard.step` returned."""
        self.streak = 0
        self.reported = False

    def step_ended(self) -> None:
        if self.scheduler is not None:
            self.at_exit = self.scheduler.last_epoch

    def check(self, step: int) -> Event | None:
        """The warning, at the `SCHEDULE_STEPS`th guarded step in a row before which the
        scheduler moved on by itself."""
        if self.scheduler is None or self.at_exit is None or self.reported:
            return None
        moved = self.scheduler.last_epoch - self.at_exit
        self.streak = self.streak + 1 if 1 <= moved <= MOST_MOVED else 0
        if self.streak < SCHEDULE_STEPS:
            return None
        self.reported = True
        name = type(self.scheduler).__name__
        return Event(
            kind="scheduler_step_outside", step=step, severity="warning",
            message=(f"{name}.step() ran outside guard.step before each of the last "
                     f"{self.streak} steps: guard.step steps the scheduler it was given, so the "
                     f"loop's own call steps it again and the schedule runs {1 + moved}x as "
                     "fast (its warmup and decay done early, its LR at the end reached "
                     "halfway). Fix: remove the loop's scheduler.step(), or give the Guard "
                     "scheduler=None"),
            value=float(moved), details={"moved": moved})
