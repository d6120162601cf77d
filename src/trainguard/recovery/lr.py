"""Learning-rate backoff after a rollback: a factor on top of whatever the scheduler sets.

The factor starts at `start` and ramps linearly back to `ceiling` over `ramp_steps` applied
updates. It is taken off before `scheduler.step()` and put back after it, so chainable schedulers
(which read the current LR) and closed-form ones (LambdaLR, which recompute from `base_lrs`) both
see the LR of the plain schedule and the backoff never compounds.
"""

from __future__ import annotations

from typing import Any

import torch


class LRBackoff:
    def __init__(self, optimizers: list[torch.optim.Optimizer], ramp_steps: int) -> None:
        self.optimizers = optimizers
        self.ramp_steps = ramp_steps
        self.start = 1.0
        self.ceiling = 1.0
        self.progress = 0
        self._pure: list[float] = []
        """The schedule's own LR of every param group while a factor is applied."""
        self._set: list[float] = []
        """The LR we wrote, to tell whether user code changed it since."""

    @property
    def active(self) -> bool:
        return bool(self._pure)

    def factor(self) -> float:
        if self.ramp_steps == 0 or self.progress >= self.ramp_steps:
            return self.ceiling
        return self.start + (self.ceiling - self.start) * self.progress / self.ramp_steps

    def begin(self, start: float, ceiling: float, pure_lrs: list[float]) -> None:
        """Start a backoff from `start` towards `ceiling`, on top of the schedule's `pure_lrs`."""
        self.start, self.ceiling, self.progress = start, ceiling, 0
        self._pure = list(pure_lrs)
        self._apply()

    def pure_lrs(self) -> list[float]:
        """The LR the schedule alone would use, per param group."""
        if self.active:
            self._take_off()
            lrs = list(self._pure)
            self._apply()
            return lrs
        return [float(g["lr"]) for g in self._groups()]

    def around_scheduler_step(self, scheduler: Any) -> None:
        """Replace `scheduler.step()` on an applied update: the schedule moves on, the ramp too."""
        if not self.active:
            if scheduler is not None:
                scheduler.step()
            return
        self._take_off()
        if scheduler is not None:
            scheduler.step()
        self._pure = [float(g["lr"]) for g in self._groups()]
        self.progress += 1
        if self.factor() == 1.0 and self.progress >= self.ramp_steps:
            self._pure, self._set = [], []  # fully ramped back to the plain schedule
            return
        self._apply()

    def _groups(self) -> list[dict[str, Any]]:
        return [g for opt in self.optimizers for g in opt.param_groups]

    def _take_off(self) -> None:
        factor = self.factor()
        for i, group in enumerate(self._groups()):
            if i < len(self._set) and group["lr"] != self._set[i]:  # changed by user code
                self._pure[i] = float(group["lr"]) / factor
            group["lr"] = self._pure[i]

    def _apply(self) -> None:
        factor = self.factor()
        self._set = []
        for i, group in enumerate(self._groups()):
            group["lr"] = self._pure[i] * factor
            self._set.append(group["lr"])

    def state_dict(self) -> dict[str, Any]:
        return {"start": self.start, "ceiling": self.ceiling, "progress": self.progress,
                "pure": list(self._pure), "set": list(self._set)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start = float(state["start"])
        self.ceiling = float(state["ceiling"])
        self.progress = int(state["progress"])
        self._pure = [float(v) for v in state["pure"]]
        self._set = [float(v) for v in state["set"]]
