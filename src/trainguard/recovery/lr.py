"""Learning-rate backoff after a rollback: a factor on top of whatever the scheduler sets.

The factor starts at `start` and ramps linearly back to `ceiling` over `ramp_steps` applied
updates. It is applied by scaling both the optimizer's LR and the schedulers' `base_lrs`
(`scale_learning_rate`), so it survives closed-form schedulers (LambdaLR and friends recompute the
LR from `base_lrs`) and chainable ones (which start from the current LR) alike, whoever calls
`scheduler.step()`: the plain-loop Guard or a framework trainer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from trainguard.errors import UsageError


def set_lr(group: dict[str, Any], value: Any) -> None:
    current = group["lr"]
    if isinstance(current, torch.Tensor):  # capturable optimizers keep the LR as a tensor
        current.copy_(value)
    else:
        group["lr"] = value


def scale_learning_rate(optimizer: torch.optim.Optimizer, schedulers: Iterable[Any],
                        factor: float) -> None:
    """Multiply the learning rate by `factor` so that the change survives the next scheduler step.

    `LambdaLR` (and every closed-form scheduler) recomputes lr = base_lr * f(step) from its
    `base_lrs`, so changing `param_groups` alone is undone at the next step: scale both, and the
    `initial_lr` a resumed scheduler rebuilds its base from.
    """
    if (not isinstance(factor, (int, float)) or isinstance(factor, bool)
            or not math.isfinite(factor) or not factor > 0):
        raise UsageError(f"the learning-rate factor must be a finite number > 0, got {factor!r}")
    for group in optimizer.param_groups:
        set_lr(group, group["lr"] * factor)
        if "initial_lr" in group:
            group["initial_lr"] = group["initial_lr"] * factor
    for scheduler in schedulers:
        if isinstance(getattr(scheduler, "base_lrs", None), list):
            scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]
        if isinstance(getattr(scheduler, "_last_lr", None), list):
            scheduler._last_lr = [lr * factor for lr in scheduler._last_lr]


class LRBackoff:
    def __init__(self, optimizers: list[torch.optim.Optimizer], schedulers: list[Any],
                 ramp_steps: int) -> None:
        self.optimizers = optimizers
        self.schedulers = schedulers
        self.ramp_steps = ramp_steps
        self.start = 1.0
        self.ceiling = 1.0
        self.progress = 0
        self.active = False

    def factor(self) -> float:
        """The factor in force now (1.0 when no backoff is on)."""
        if not self.active:
            return 1.0
        if self.ramp_steps == 0 or self.progress >= self.ramp_steps:
            return self.ceiling
        return self.start + (self.ceiling - self.start) * self.progress / self.ramp_steps

    def begin(self, start: float, ceiling: float, applied: float) -> None:
        """Start a backoff from `start` towards `ceiling`. `applied` is the factor the current
        learning rates already carry (that of a restored state taken during an earlier backoff)."""
        self.start, self.ceiling, self.progress, self.active = start, ceiling, 0, True
        self._rescale(self.factor() / applied)

    def step(self) -> None:
        """After the scheduler step of an applied update: move the ramp on by one step."""
        if not self.active:
            return
        before = self.factor()
        self.progress += 1
        after = self.factor()
        if after != before:
            self._rescale(after / before)
        if after == 1.0 and self.progress >= self.ramp_steps:
            self.active = False  # fully back on the plain schedule: nothing more to do per step

    def _rescale(self, ratio: float) -> None:
        if ratio == 1.0:
            return
        for i, optimizer in enumerate(self.optimizers):  # each scheduler is scaled once
            scale_learning_rate(optimizer, self.schedulers if i == 0 else [], ratio)

    def state_dict(self) -> dict[str, Any]:
        return {"start": self.start, "ceiling": self.ceiling, "progress": self.progress,
                "active": self.active}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start = float(state["start"])
        self.ceiling = float(state["ceiling"])
        self.progress = int(state["progress"])
        self.active = bool(state["active"])
