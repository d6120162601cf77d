"""`lr_at_zero`: every parameter group's LR has been exactly 0 for a while, after it was positive.

At LR 0 every torch optimizer's step changes nothing (weight decay is scaled by the LR too), so
the run goes on spending compute and learns nothing. What leaves it there: a scheduler whose
length (`num_training_steps`, `total_iters`) is shorter than the run, so a linear or polynomial
decay sits at 0 for the rest of it; a scheduler stepped more often than the optimizer; or the
loop's own code setting `param_group["lr"]`. Told once per episode, after
`detectors.lr_at_zero.steps` steps in a row at 0 (a schedule that touches 0 for one step, the
low point of a cosine cycle, a decay whose last step lands on 0, is no news). A warm-up that
starts at 0 is not counted: the LR must have been positive first. One group at 0 beside others
that train is a choice people make to freeze a part; only every group at 0 is told. A run whose
LR stays at 0 to its end is `stalled` from the first step at 0 (`untrained`).

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


class LRAtZero(StreakDetector):
    kind = "lr_at_zero"
    budget_us = 3.0  # a max over the groups' LRs
    reads = frozenset({"group_lrs"})
    live_only = True

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.last_positive = 0.0
        """The largest LR of the last step at which any group's LR was positive (0: none yet)."""

    @property
    def needed(self) -> int:
        return self.config.lr_at_zero.steps

    def check(self, signals: StepSignals) -> list[Event]:
        lrs = signals.group_lrs
        if not lrs:
            return []
        if all(lr == 0.0 for lr in lrs):
            if not self.last_positive:
                return []  # a warm-up from 0
            if not self.count(True):
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
        """Calm rows, while no streak is under way: rows up to the first at which every group's
        LR is 0. The state follows from the last row with a positive LR."""
        if self.streak or self.episode.active:
            return start
        given = columns.has_lr[start:end]
        rows = columns.group_lrs[start:end]
        zero = given & (rows == 0.0).all(axis=1)
        stop = int(np.argmax(zero)) if zero.any() else len(rows)
        positive = finite_positive(rows[:stop]) & given[:stop, None]
        with_positive = np.flatnonzero(positive.any(axis=1))
        if len(with_positive):
            last = rows[with_positive[-1]]
            self.last_positive = float(last[positive[with_positive[-1]]].max())
        return start + stop

    def untrained(self) -> tuple[int, str] | None:
        if self.streak >= self.needed:
            return self.streak, "the LR at 0 in every parameter group"
        return None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "last_positive": self.last_positive}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.last_positive = float(state.get("last_positive", 0.0))
