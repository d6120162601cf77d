"""`lr_at_zero`: every parameter group's LR has been 0 for a while, after it was positive.

"0" is exactly 0, or under `TINY` of the highest LR the run had (a scheduler stepped per batch
where it was written per epoch decays it geometrically without ever reaching 0).

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

An LR under `FADED` of the highest is told too, once it has stayed there as many steps as it took
to fall there from the last step at the highest (and at least `steps`): a scheduler stepped per
batch where it was written per epoch takes a few hundred steps to fall four decades and then
holds it there, where a decay meant for the run spends its last sliver there (a cosine its last
0.6%) and a step schedule stops at three decades. One stretch is told once, whichever comes
first.

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
from trainguard.detect.calm import SignalColumns
from trainguard.events import Event
from trainguard.signals import StepSignals

TINY = 1e-12
"""An LR under this share of the highest the run had moves nothing either (a float32 weight
resolves 1e-7 of itself): where a scheduler stepped per batch decays it, geometrically, without
ever reaching 0. A cosine ends above it but for its last step or two on runs of millions."""
FADED = 1e-4 * (1 + 1e-9)
"""An LR under this share of the highest (four decades: four decays by 0.1 land on it, give or
take their last bits) moves the weights at most that much of what a step at the highest did:
told once it has stayed so as long as it took to fall there."""
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
    budget_us = 3.5  # two passes over the groups' LRs (3.1 -> 3.4 us with the second)
    reads = frozenset({"group_lrs"})
    live_only = True

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.highest = 0.0
        """The highest finite LR any group has had (0: none positive yet)."""
        self.seen = 0
        """Steps seen with an LR."""
        self.streak_top = 0.0
        """The highest LR of the steps in the streak (0: all exactly 0)."""
        self.judged = True
        """False for an optimizer whose step the LR does not scale (`lr_scales_steps`)."""
        self.top_seen = 0
        """`seen` at the last step whose LR was the highest so far."""
        self.faded_run = 0
        """Steps in a row with every group's LR under `FADED` of the highest."""
        self.fall = 0
        """The steps from the last at the highest to the first of that stretch."""
        self.told = False
        """This stretch was told (at 0 or faded): once per stretch."""

    @property
    def needed(self) -> int:
        return self.config.lr_at_zero.steps

    def check(self, signals: StepSignals) -> list[Event]:
        lrs = signals.group_lrs
        if not lrs or not self.judged:
            return []
        self.seen += 1
        highest = self.highest
        if highest and self._under(lrs, FADED):
            self.faded_run += 1
            if self.faded_run == 1:
                self.fall = self.seen - self.top_seen
        else:
            self.faded_run, self.told = 0, False
        if self.idle(lrs):
            if not highest:
                return []  # a warm-up from 0
            self.streak += 1  # neither calm nor told yet: the episode does not re-arm at 0
            self.streak_top = max(self.streak_top, *lrs)
            if (self.streak < self.needed or not self.episode.update(True)
                    or self.told):
                return []
            self.told = True
            first = signals.step - self.streak + 1
            what = ("0" if not self.streak_top
                    else f"under {TINY:g} of its highest (at most {self.streak_top:.3g})")
            return [self.event(
                signals.step, "warning",
                f"the LR has been {what} in every parameter group for {self.streak} steps "
                f"(since step {first}; its highest was {highest:.3g}): the optimizer steps "
                "change nothing, so nothing trains. A scheduler shorter than the run "
                "(num_training_steps, total_iters below the optimizer steps taken) or stepped "
                "per batch where it was written per epoch leaves it there, as does code that "
                "sets param_group['lr']",
                value=self.streak_top, since=first, highest=highest)]
        events = self._faded(signals, lrs)
        finite = [lr for lr in lrs if math.isfinite(lr)]
        if finite:
            self.highest = max(highest, *finite)
            if max(finite) >= self.highest:
                self.top_seen = self.seen
        self.streak_top = 0.0
        self.count(False)
        return events

    def _faded(self, signals: StepSignals, lrs: tuple[float, ...]) -> list[Event]:
        """The faded stretch told, once it has lasted as long as the fall into it."""
        if self.told or not self.faded_run or self.faded_run < max(self.needed, self.fall):
            return []
        self.told = True
        first = signals.step - self.faded_run + 1
        top = max(lr for lr in lrs if math.isfinite(lr))
        return [self.event(
            signals.step, "warning",
            f"the LR has been under {FADED:.0e} of its highest in every parameter group for "
            f"{self.faded_run} steps (since step {first}, at most {top:.3g} now; its highest was "
            f"{self.highest:.3g}), as long as it took to fall there ({self.fall} steps): the "
            f"steps since move the weights at most {FADED:.0e} of what a step at the highest "
            "did. A scheduler stepped per batch where it was written per epoch (StepLR, "
            "MultiStepLR and ExponentialLR count epochs) decays this fast, as does a decay far "
            "shorter than the run",
            value=top, since=first, highest=self.highest)]

    def idle(self, lrs: tuple[float, ...]) -> bool:
        """Whether every group's LR is 0 (or under `TINY` of the highest so far, not
        negative): what this detector counts; the calm lane leaves such a step to the full
        check, so that the warning comes at its step."""
        return self._under(lrs, TINY)

    def _under(self, lrs: tuple[float, ...], share: float) -> bool:
        """Whether every group's LR is 0 or under `share` of the highest so far (not negative)."""
        return all(lr == 0.0 or (math.isfinite(lr) and 0.0 <= lr <= share * self.highest)
                   for lr in lrs)

    def skip_calm(self, columns: SignalColumns, start: int, end: int) -> int:
        """Calm rows, while no streak is under way: rows up to the first whose LRs are all at 0
        (or under `TINY` of the highest before them) or missing (NaN: `check` may read fewer
        groups there). The state follows from the rows' highest LR and their count."""
        if not self.judged:
            return end
        if self.streak or self.episode.active or self.faded_run:
            return start
        given = columns.has_lr[start:end]
        rows = columns.group_lrs[start:end]
        finite = np.isfinite(rows)
        row_top = np.where(given, np.where(finite, rows, -np.inf).max(axis=1, initial=-np.inf),
                           -np.inf)
        before = np.maximum.accumulate(np.concatenate([[self.highest], row_top]))[:-1]
        with np.errstate(invalid="ignore"):
            low = ((rows == 0.0) | (finite & (rows >= 0.0) & (rows <= FADED * before[:, None]))
                   | ~finite)
        zero = given & low.all(axis=1)
        stop = int(np.argmax(zero)) if zero.any() else len(rows)
        if stop:
            self.highest = max(self.highest, float(before[stop - 1]), float(row_top[stop - 1]))
            seen = self.seen + np.cumsum(given[:stop])
            top = given[:stop] & (row_top[:stop] >= before[:stop]) & (row_top[:stop] > -np.inf)
            if top.any():
                self.top_seen = int(seen[np.flatnonzero(top)[-1]])
        self.seen += int(given[:stop].sum())
        return start + stop

    def untrained(self) -> tuple[int, str] | None:
        if self.streak >= max(self.needed, UNTRAINED_SHARE * self.seen):
            what = "at 0" if not self.streak_top else f"under {TINY:g} of its highest"
            return self.streak, f"the LR {what} in every parameter group"
        return None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "highest": self.highest, "seen": self.seen,
                "streak_top": self.streak_top, "top_seen": self.top_seen,
                "faded_run": self.faded_run, "fall": self.fall, "told": self.told}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.highest = float(state.get("highest", 0.0))
        self.streak_top = float(state.get("streak_top", 0.0))
        self.seen = int(state.get("seen", 0))
        self.top_seen = int(state.get("top_seen", 0))
        self.faded_run = int(state.get("faded_run", 0))
        self.fall = int(state.get("fall", 0))
        self.told = bool(state.get("told", False))
