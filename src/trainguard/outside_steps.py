"""Optimizer steps taken outside `Guard.step`: the loop that still calls `optimizer.step()`.

`Guard.step` takes the optimizer step itself (with the scheduler's and the GradScaler's). A loop
moved over to trainguard that keeps its own `optimizer.step()` updates twice per batch, the second
time with gradients nobody checked or clipped: nothing fails, the run just trains at about twice
the step size. A post-hook on the optimizer counts every step; the Guard notes the count when its
own step ends, so any step counted before the next `Guard.step` starts was the loop's.

Only the plain-loop Guard counts: under a trainer (the HF and Lightning callbacks) the trainer
takes the step, whatever the loop does.
"""

from __future__ import annotations

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
