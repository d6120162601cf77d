"""`lr_at_zero`: every parameter group's LR has been exactly 0 for a while, after it was positive.

At LR 0 the step of an optimizer that scales it by the LR (SGD, Adam and their kin, weight decay
included) changes nothing, so the run goes on spending compute and learns nothing. What leaves
it there: a scheduler whose length (`num_training_steps`, `total_iters`) is shorter than the run,
so a linear or polynomial decay sits at 0 for the rest of it; a scheduler stepped more often than
the optimizer; a cosine stepped per epoch that reaches 0 and holds it for an epoch; or the loop's
own code setting `param_group["lr"]`. Told once per episode, after `detectors.lr_at_zero.steps`
steps in a row at 0 (a schedule stepped every step touches 0 for one step at the low point of a
cosine cycle, or at the end of a decay: no news). A warm-up that starts at 0 is not counted:
the LR must have been positive first. One group at 0 beside others that train is a choice
people make to freeze a part; only every group at 0 is told. `Rprop` sizes its steps from its
own state once started, and is not judged (`lr_scales_steps`).

A run whose LR stays at 0 to its end is `stalled` from the first step at 0 (`untrained`) when
that stretch is at least `UNTRAINED_SHARE` of the steps seen: a schedule one epoch short of a
long run trained most of it, and its verdict is its loss's.

Live only: a log prints its LR rounded (`0.0000` for 3e-5), so a 0 there is not a 0.
"""


from __future__ import annotations

import math
from typing import Any

import numpy as np

from trainguard.detect.base import StreakDetector
from trainguard.detect.calm import SignalColumns, finite_positive
from trainguard.events import Event
from trainguard.signals import StepSignals

UNTRAINED_SHARE = 0.1
"""A stretch at 0 to the run's end makes it `stalled` when it is at least this share of the
steps seen."""


def lr_scales_steps(optimizer: Any) -> bool:
    """Whether the optimizer's step is scaled by its groups' LR (torch's Rprop's is not: its
    step sizes start at the LR and then follow the gradient's signs alone). Read from the
    class, so that the detectors import no torch."""
    return not any(cls.__name__ == "Rprop" and cls.__module__.startswith("torch.optim")
                   for cls in type(optimizer).__mro__)


class LRAtZero(StreakDetector):
    kind = "lr_at_zero"
    budget_us = 3.0  # a max over the groups' LRs
    reads = frozenset({"group_lrs"})
    live_only = True

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.last_positive = 0.0
        """The largest LR of the last step at which any group's LR was positive (0: none yet)."""
        self.seen = 0
        """Steps seen with an LR."""
        self.judged = True
        """False for an optimizer whose step the LR does not scale (`lr_scales_steps`)."""

    @property
    def needed(self) -> int:
        return self.config.lr_at_zero.steps

    def check(self, signals: StepSignals) -> list[Event]:
        lrs = signals.group_lrs
        if not lrs or not self.judged:
            return []
        self.seen += 1
        if all(lr == 0.0 for lr in lrs):
            if not self.last_positive:
                return []  # a warm-up from 0
            self.streak += 1  # neither calm nor told yet: the episode does not re-arm at 0
            if self.streak < self.needed or not self.episode.update(True):
                return []
            first = signals.step - self.streak + 1
            return [self.event(
                signals.step, "warning",
                f"the LR has been 0 in every parameter group for {self.streak} steps (since "
                f"step {first}; it was {self.last_positive:.3g} before): the optimizer steps "
                "change nothing, so nothing trains. A scheduler shorter than the run "
                "(num_training_steps, total_iters below the optimizer steps taken) leaves it "
                "there, as does code that sets param_group['lr']",
                value=0.0, since=first, before=self.last_positive)]
        positive = [lr for lr in lrs if lr > 0.0 and math.isfinite(lr)]
        if positive:
            self.last_positive = max(positive)
        self.count(False)
        return []

    def skip_calm(self, columns: SignalColumns, start: int, end: int) -> int:
        """Calm rows, while no streak is under way: rows up to the first whose LRs are all 0 or
        missing (NaN: `check` may read fewer groups there). The state follows from the rows
        with an LR and the last with a positive one."""
        if not self.judged:
            return end
        if self.streak or self.episode.active:
            return start
        given = columns.has_lr[start:end]
        rows = columns.group_lrs[start:end]
        zero = given & ((rows == 0.0) | np.isnan(rows)).all(axis=1)
        stop = int(np.argmax(zero)) if zero.any() else len(rows)
        positive = finite_positive(rows[:stop]) & given[:stop, None]
        with_positive = np.flatnonzero(positive.any(axis=1))
        if len(with_positive):
            last = rows[with_positive[-1]]
            self.last_positive = float(last[positive[with_positive[-1]]].max())
        self.seen += int(given[:stop].sum())
        return start + stop

    def untrained(self) -> tuple[int, str] | None:
        if self.streak >= max(self.needed, UNTRAINED_SHARE * self.seen):
            return self.streak, "the LR at 0 in every parameter group"
        return None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "last_positive": self.last_positive, "seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.last_positive = float(state.get("last_positive", 0.0))
        self.seen = int(state.get("seen", 0))
