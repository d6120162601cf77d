"""The run's verdict: did it end better than it was, beyond how it ended?

A run's *status* says how it ended (finished, halted, crashed, interrupted); its *verdict* says
whether training worked:

    healthy     no trouble (no event of warning severity or worse), and the loss did not end
                above where it started
    recovered   trouble came, and the loss ended no worse than it was before the trouble
    degraded    the loss ended worse than before its first trouble (or than its start, when
                there was none): a run that "finished" but is worse off than it was

Levels are medians of `WINDOW` finite losses (the first ones, the last ones before the first
trouble, the last ones of the run), so one noisy batch decides nothing. "Worse" means above the
reference by `DEGRADED_RATIO` and by more than the final window's own spread, or above it by
`BEYOND_NOISE` whatever the spread (a run thrashing at 30x its old loss is not excused by its own
thrashing).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trainguard.signals import MAD_TO_STD

WINDOW = 20
DEGRADED_RATIO = 1.1
"""A final loss 10% above the reference is worse than noise at the medians' resolution."""
BEYOND_NOISE = 2.0
"""A final median this many times the reference is degraded, however noisy the final window."""


@dataclass(frozen=True, slots=True)
class RunVerdict:
    verdict: str
    """`healthy`, `recovered` or `degraded`."""
    message: str
    start: float | None
    before_trouble: float | None
    final: float | None
    trouble_step: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "message": self.message, "start": self.start,
                "before_trouble": self.before_trouble, "final": self.final,
                "trouble_step": self.trouble_step}


def ended_worse(final: float, reference: float, tail: Iterable[float]) -> bool:
    """The rule of "worse" that the live verdict and the verdict on a log share: `final` (the
    median of the last losses, `tail`) above `reference` by `DEGRADED_RATIO` and beyond the
    tail's own spread, or by `BEYOND_NOISE` whatever the spread."""
    if not final > DEGRADED_RATIO * reference:
        return False
    if final > BEYOND_NOISE * reference:
        return True
    spread = MAD_TO_STD * statistics.median(abs(v - final) for v in tail)
    return final - reference > spread


class LossTrack:
    """The few loss levels the verdict needs, kept as the run goes (a bounded memory)."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self.first: list[float] = []
        self.recent: deque[float] = deque(maxlen=window)
        self.before_trouble: float | None = None
        self.trouble_step: int | None = None
        self.nonfinite_tail = 0
        """Non-finite losses since the last finite one."""

    def observe(self, step: int, loss: float | None, *, trouble: bool) -> None:
        if trouble and self.trouble_step is None:
            self.trouble_step = step
            self.before_trouble = (statistics.median(self.recent) if len(self.recent) >= 3
                                   else self._start())
        if loss is None:
            return
        if not math.isfinite(loss):
            self.nonfinite_tail += 1
            return
        self.nonfinite_tail = 0
        if len(self.first) < self.window // 2:
            self.first.append(loss)
        self.recent.append(loss)

    def _start(self) -> float | None:
        return statistics.median(self.first) if self.first else None

    def verdict(self) -> RunVerdict | None:
        """None when no loss was ever seen."""
        start = self._start()
        if start is None:
            return None
        reference = self.before_trouble if self.before_trouble is not None else start
        against = ("before the first trouble" + (f" (step {self.trouble_step})"
                                                  if self.trouble_step is not None else "")
                   if self.before_trouble is not None else "at the start")
        if self.nonfinite_tail >= self.window // 2 or not self.recent:
            return RunVerdict("degraded", f"the last {self.nonfinite_tail} losses were not "
                              "finite", start, self.before_trouble, math.nan, self.trouble_step)
        final = statistics.median(self.recent)
        if ended_worse(final, reference, self.recent):
            return RunVerdict("degraded", f"the loss ended at {final:.4g}, "
                              f"{final / reference:.3g}x the {reference:.4g} it was {against}",
                              start,
                              self.before_trouble, final, self.trouble_step)
        if self.trouble_step is not None:
            how = ("no worse than" if final <= reference
                   else f"within {DEGRADED_RATIO - 1:.0%} (or the noise) of")
            return RunVerdict("recovered", f"the loss ended at {final:.4g}, {how} the "
                              f"{reference:.4g} it was {against}", start, self.before_trouble,
                              final, self.trouble_step)
        return RunVerdict("healthy", f"the loss went from {start:.4g} to {final:.4g}", start,
                          None, final, None)

    def state_dict(self) -> dict[str, Any]:
        return {"first": list(self.first), "recent": list(self.recent),
                "before_trouble": self.before_trouble, "trouble_step": self.trouble_step,
                "nonfinite_tail": self.nonfinite_tail}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.first = [float(v) for v in state["first"]]
        self.recent = deque((float(v) for v in state["recent"]), maxlen=self.window)
        before = state.get("before_trouble")
        self.before_trouble = None if before is None else float(before)
        trouble = state.get("trouble_step")
        self.trouble_step = None if trouble is None else int(trouble)
        self.nonfinite_tail = int(state.get("nonfinite_tail", 0))
