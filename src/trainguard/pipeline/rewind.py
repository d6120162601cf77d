"""`ScheduleRewind`: undo the scheduler step a trainer takes after a skipped optimizer step.

Trainers (HF, Lightning) step their LR schedulers after every optimizer step, whatever a callback
decided; a skipped update must not move the schedule, so `act` remembers it and `settle` puts it
back. The plain-loop Guard steps its scheduler only on applied updates and has nothing to undo.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import torch

from trainguard.recovery.lr import set_lr


class ScheduleRewind:
    """Puts schedulers and learning rates back where they were before a skipped step (for
    trainers that step their schedulers whatever a callback decided)."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedulers: Iterable[Any]) -> None:
        self.optimizer = optimizer
        self.schedulers = [s for s in schedulers
                           if callable(getattr(s, "state_dict", None))
                           and callable(getattr(s, "load_state_dict", None))]
        self._lrs: list[Any] | None = None
        self._states: list[dict[str, Any]] = []

    def remember(self) -> None:
        """Call before the trainer steps its schedulers (only on skipped steps: a copy per call)."""
        self._lrs = [g["lr"].clone() if isinstance(g["lr"], torch.Tensor) else g["lr"]
                     for g in self.optimizer.param_groups]
        self._states = [copy.deepcopy(s.state_dict()) for s in self.schedulers]

    def restore(self) -> None:
        """Undo whatever the schedulers did since `remember` (nothing when they did not step)."""
        if self._lrs is None:
            return
        for scheduler, state in zip(self.schedulers, self._states, strict=True):
            scheduler.load_state_dict(state)
        for group, lr in zip(self.optimizer.param_groups, self._lrs, strict=False):
            set_lr(group, lr)
        self._lrs, self._states = None, []
