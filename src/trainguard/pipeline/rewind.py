"""`ScheduleRewind`: undo the scheduler step a trainer takes after a skipped optimizer step.

Trainers (HF, Lightning) step their LR schedulers after every optimizer step, whatever a callback
decided; a skipped update must not move the schedule, so `act` marks where it is
(`StepContext.schedule_mark`) and `settle` puts it back. The mark is the step's own value: the
rewind keeps nothing between steps. The plain-loop Guard steps its scheduler only on applied
updates and has nothing to undo.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainguard.recovery.lr import set_lr


@dataclass(frozen=True, slots=True)
class ScheduleMark:
    """Where the schedulers and learning rates were before a trainer stepped them."""

    rewind: ScheduleRewind
    lrs: list[Any]
    states: list[dict[str, Any]] = field(default_factory=list)

    def restore(self) -> None:
        """Undo whatever the schedulers did since the mark (nothing when they did not step)."""
        rewind = self.rewind
        for scheduler, state in zip(rewind.schedulers, self.states, strict=True):
            scheduler.load_state_dict(state)
        for group, lr in zip(rewind.optimizer.param_groups, self.lrs, strict=False):
            set_lr(group, lr)


class ScheduleRewind:
    """Puts schedulers and learning rates back where they were before a skipped step (for
    trainers that step their schedulers whatever a callback decided)."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedulers: Iterable[Any]) -> None:
        self.optimizer = optimizer
        self.schedulers = [s for s in schedulers
                           if callable(getattr(s, "state_dict", None))
                           and callable(getattr(s, "load_state_dict", None))]

    def remember(self) -> ScheduleMark:
        """Call before the trainer steps its schedulers (only on skipped steps: a copy per call)."""
        return ScheduleMark(
            self, [g["lr"].clone() if isinstance(g["lr"], torch.Tensor) else g["lr"]
                   for g in self.optimizer.param_groups],
            [copy.deepcopy(s.state_dict()) for s in self.schedulers])
