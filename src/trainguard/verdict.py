"""The run's verdict: did it end better than it was, beyond how it ended?

A run's *status* says how it ended (finished, halted, failed, crashed, interrupted); its *verdict*
says whether training worked:

    healthy     no trouble (no event of warning severity or worse), and the loss did not end
                above where it started
    recovered   trouble came, and the loss ended no worse than it was before the trouble and
                back on its own best level
    degraded    the loss ended worse than before its first trouble (or than its start, when
                there was none), or, after trouble, worse than the best level the run had
                reached, or whose weights are not all finite at its close: a run that
                "finished" but is worse off than it was
    stalled     the run trained long enough to tell (`DetectorConfig.no_progress.steps` losses) and
                its loss never came down beyond its own noise at the start
                (`detect.no_progress.came_down`): it did not learn, with or without trouble
                (said with what the run showed of why: `detect/stall_reason.py`); or its last
                steps learned nothing (`Detector.untrained`: no gradient, the reward or the
                preference signal dead, to the end; or the Guard skipped every one of them)

A run with fewer finite losses than the window (`WINDOW`) is too short to judge: it gets no
verdict (`RunVerdict.verdict` is None, its message says "too short to judge"), unless what it
shows needs no comparison of levels: it was halted, its weights are not all finite, its last
losses were not, or it stopped training.

Levels are medians of `WINDOW` finite losses (the first ones, the last ones before the first
trouble, the last ones of the run), so one noisy batch decides nothing; when trouble began
among the last ones, the run's end is the median of the losses from there on (a run stopped a
few steps into a blow-up is not back on its level because most of its last window predates it).
"Worse" means above the reference by `DEGRADED_RATIO` and by more than the final window's own
spread, or above it by `BEYOND_NOISE` whatever the spread (a run thrashing at 30x its old loss is
not excused by its own thrashing).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from typing import Any

from trainguard.detect.no_progress import came_down, flat, judgeable, progressed
from trainguard.run_verdict import RunVerdict as RunVerdict  # its old import path
from trainguard.signals import MAD_TO_STD
from trainguard.vocabulary import DEGRADED, HEALTHY, RECOVERED, STALLED

WINDOW = 20
MIN_TAIL = 3
"""Losses after trouble began in the last window that the verdict needs to judge the run's end
by them alone."""
STALL_STEPS = 100
"""`DetectorConfig.no_progress.steps`' default: the losses a run needs before it can be
`stalled`."""
DEGRADED_RATIO = 1.1
"""A final loss 10% above the reference is worse than noise at the medians' resolution."""
BEYOND_NOISE = 2.0
"""A final median this many times the reference is degraded, however noisy the final window."""


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


def times(value: float, reference: float) -> str:
    """`value` against `reference` in words: "3.2x", or "above" where `reference` is zero or
    below (a penalty that starts at 0, a loss that goes negative) and takes no ratio."""
    return f"{value / reference:.3g}x" if reference > 0 else "above"


class LossTrack:
    """The few loss levels the verdict needs, kept as the run goes (a bounded memory)."""

    def __init__(self, window: int = WINDOW, stall_steps: int = STALL_STEPS) -> None:
        self.window = window
        self.stall_steps = stall_steps
        self.recent: deque[float] = deque(maxlen=window)
        self.before_trouble: float | None = None
        self.trouble_step: int | None = None
        self.nonfinite_tail = 0
        """Non-finite losses since the last finite one."""
        self.start: list[float] = []
        """The first `window` finite losses (the start level and its noise)."""
        self.best: float | None = None
        """The lowest median of `window` recent losses the run reached."""
        self.seen = 0
        """Finite losses seen."""
        self.history: deque[float] = deque(maxlen=stall_steps)
        """The last `stall_steps` finite losses (their trend)."""
        self.recent_steps: deque[int] = deque(maxlen=window)
        """The steps of `recent`'s losses."""
        self.trouble_steps: deque[int] = deque(maxlen=window)
        """The last steps with trouble (a warning or worse)."""
        self.trouble_at_start = False
        """The first trouble came before the run's third loss: the level before it is where
        the run started."""

    def observe(self, step: int, loss: float | None, *, trouble: bool) -> None:
        if trouble and self.trouble_step is None:
            self.trouble_step = step
            self.trouble_at_start = len(self.recent) < 3
            self.before_trouble = (self._start() if self.trouble_at_start
                                   else statistics.median(self.recent))
        if trouble:
            self.trouble_steps.append(step)
        if loss is None:
            return
        loss = float(loss)
        if not math.isfinite(loss):
            self.nonfinite_tail += 1
            return
        self.nonfinite_tail = 0
        self.seen += 1
        if len(self.start) < self.window:
            self.start.append(loss)
        self.recent.append(loss)
        self.recent_steps.append(step)
        self.history.append(loss)
        if len(self.recent) == self.window:
            level = statistics.median(self.recent)
            self.best = level if self.best is None else min(self.best, level)

    @property
    def first(self) -> list[float]:
        """The first half-window of losses: the start level the verdict compares with."""
        return self.start[: self.window // 2]

    def _start(self) -> float | None:
        return statistics.median(self.first) if self.first else None

    def verdict(self, *, halted: bool = False, halt_step: int | None = None,
                weights_finite: bool | None = None,
                untrained: tuple[int, str] | None = None,
                stall_reason: str = "",
                broken_output: tuple[int, str] | None = None,
                unjudged: str = "") -> RunVerdict | None:
        """None when no loss was ever seen (`_without_loss`). `halted`: the run was stopped by
        the Guard, so it did not recover, whatever the losses before the halt said; `halt_step`,
        the step it stopped at, when known (the trouble may have begun many steps before it).
        `weights_finite`: whether the model's weights are all finite at the end (None: not
        checked); a model with a NaN in it is degraded, whatever its last finite losses said.
        `untrained`: the first step of a stretch that lasted to the end over which nothing was
        learned, and what it was (no gradients: `detect/no_gradients.py`; steps all skipped; a
        reward or preference signal that never moved the policy: `Detector.untrained`):
        nothing trained after it, so the run stalled, however its loss compares (it stays where
        the last update left it, or a saturated objective reads low).
        `stall_reason`: what the run showed of why it did not learn (`no_progress`'s reason),
        said after a `stalled` verdict. `broken_output`: since when and how the model's samples
        were broken up to the last check (`detect/sample_judge.py`): degraded, whatever the loss.
        `unjudged`: why the loss's level says nothing of training (`nll_loss` of raw scores,
        which falls without bound whatever is learned): no verdict from it, unless a halt, a
        non-finite end, a stretch that learned nothing or broken samples say one."""
        start = self._start()
        if start is None:
            return self._without_loss(halted or halt_step is not None, halt_step, untrained)
        reference = self.before_trouble if self.before_trouble is not None else start
        against = ("before the first trouble" + (f" (step {self.trouble_step})"
                                                  if self.trouble_step is not None else "")
                   if self.before_trouble is not None else "at the start")
        if halted or halt_step is not None:
            return self._halted(start, halt_step)
        known = self._known_end(start, weights_finite)
        if known is not None:
            return known
        # The start level is the median of the first window // 2 losses, the end level that of
        # the last `window`: with fewer losses than a window, most of the end's are the start's
        # own and its median is the start's level whatever came after ("5.103 to 5.103").
        if self.seen < self.window and untrained is None:
            return RunVerdict(None, f"too short to judge: {self.seen} finite loss(es), where the "
                              f"verdict needs {self.window} (it compares the median of the first "
                              f"{self.window // 2} with that of the last {self.window})", start,
                              self.before_trouble, None, self.trouble_step)
        tail = self._final_tail()
        final = statistics.median(tail)
        if unjudged:  # what the run showed apart from the loss's level still holds
            return self._shown_at_the_end(start, final, broken_output, untrained) or RunVerdict(
                None, f"no verdict from the loss: {unjudged}", start, self.before_trouble, None,
                self.trouble_step)
        stalled = (self.seen >= self.stall_steps and len(self.start) == self.window
                   and not progressed(self.start, list(self.recent), list(self.history))
                   and flat(self.start, list(self.recent), list(self.history))
                   and judgeable(self.start)
                   and not (self.best is not None and came_down(self.start, [self.best])))
        if ended_worse(final, reference, tail):
            return RunVerdict(DEGRADED, f"the loss ended at {final:.4g}, "
                              f"{times(final, reference)} the {reference:.4g} it was {against}",
                              start,
                              self.before_trouble, final, self.trouble_step)
        best = self.best
        if (self.trouble_step is not None and best is not None and best < reference
                and ended_worse(final, best, tail)):
            return RunVerdict(DEGRADED, f"the loss ended at {final:.4g}, {times(final, best)} "
                              f"the best level it had reached ({best:.4g}): it did not come back "
                              "to its own best", start, self.before_trouble, final,
                              self.trouble_step)
        shown = self._shown_at_the_end(start, final, broken_output, untrained)
        if shown is not None:
            return shown
        if stalled:
            return RunVerdict(STALLED, f"the loss never came down beyond its noise at the start "
                              f"in {self.seen} steps "
                              f"(from {statistics.median(self.start):.4g} at the start to "
                              f"{final:.4g}): the run did not learn"
                              + (f"; {stall_reason}" if stall_reason else ""), start,
                              self.before_trouble, final, self.trouble_step)
        if self.trouble_step is not None:
            return self._recovered(start, reference, final, against, tail)
        return RunVerdict(HEALTHY, f"the loss went from {start:.4g} to {final:.4g} (the medians "
                          f"of its first {self.window // 2} and last {len(tail)} losses)", start,
                          None, final, None)

    def _known_end(self, start: float, weights_finite: bool | None) -> RunVerdict | None:
        """What the end shows whatever the loss's level: weights or losses not finite."""
        if weights_finite is False:
            return RunVerdict(DEGRADED, "the model's weights are not all finite at the end of "
                              "the run" + (f" (the last {self.nonfinite_tail} losses were not "
                                           "finite)" if self.nonfinite_tail else ""), start,
                              self.before_trouble, math.nan, self.trouble_step)
        if self.nonfinite_tail >= self.window // 2 or not self.recent:
            return RunVerdict(DEGRADED, f"the last {self.nonfinite_tail} losses were not "
                              "finite", start, self.before_trouble, math.nan, self.trouble_step)
        return None

    def _recovered(self, start: float, reference: float, final: float, against: str,
                   tail: list[float]) -> RunVerdict:
        swings = ""
        if final <= reference:
            how = "no worse than"
        elif final <= DEGRADED_RATIO * reference:
            how = f"within {DEGRADED_RATIO - 1:.0%} of"
        else:  # above by more, within the swings of its last losses (`ended_worse`)
            how = times(final, reference)
            spread = MAD_TO_STD * statistics.median(abs(v - final) for v in tail)
            swings = f", within the swings of its last {len(tail)} losses (+-{spread:.3g})"
        # trouble before the third loss: the level before it is where the run started
        unlearned = (", where it started: it ended no lower"
                     if self.trouble_at_start and self.before_trouble is not None
                     and final >= reference else "")
        return RunVerdict(RECOVERED, f"the loss ended at {final:.4g}, {how} the "
                          f"{reference:.4g} it was {against}{unlearned}{swings}", start,
                          self.before_trouble, final, self.trouble_step)

    def _shown_at_the_end(self, start: float, final: float,
                          broken_output: tuple[int, str] | None,
                          untrained: tuple[int, str] | None) -> RunVerdict | None:
        """What the run showed lasting to its end, whatever its loss says: samples still
        broken (degraded), or nothing trained (stalled); None when it showed neither."""
        if broken_output is not None:
            since, what = broken_output
            return RunVerdict(DEGRADED, f"its samples were broken from step {since} to the "
                              f"last check ({what}), whatever the loss says (it ended at "
                              f"{final:.4g})", start, self.before_trouble, final,
                              self.trouble_step)
        if untrained is not None:
            since, what = untrained
            return RunVerdict(STALLED, f"{what} from step {since} to the end of the run: "
                              f"nothing trained after it (the loss ended at {final:.4g})",
                              start, self.before_trouble, final, self.trouble_step)
        return None

    def _without_loss(self, halted: bool, halt_step: int | None,
                      untrained: tuple[int, str] | None) -> RunVerdict | None:
        """No finite loss judged (a policy-gradient surrogate, losses all NaN): `degraded` when
        halted, `stalled` when a stretch that learned nothing lasted to the end (a reward dead
        to the last step), else no verdict."""
        if halted:
            return self._halted(None, halt_step)
        if untrained is None:
            return None
        since, what = untrained
        return RunVerdict(STALLED, f"{what} from step {since} to the end of the run: nothing "
                          "trained after it (no loss was judged)", None, None, None,
                          self.trouble_step)

    def _halted(self, start: float | None, halt_step: int | None) -> RunVerdict:
        """A halted run is degraded: it stopped at the trouble, and the losses before it say
        nothing of coming back."""
        at = f" at step {halt_step}" if halt_step is not None else ""
        if self.nonfinite_tail:
            return RunVerdict(DEGRADED, f"the run was halted{at} on a non-finite loss", start,
                              self.before_trouble, math.nan, self.trouble_step, halt_step)
        began = (f" that began at step {self.trouble_step}"
                 if self.trouble_step is not None and self.trouble_step != halt_step else "")
        was = (f" (the loss was {self.before_trouble:.4g} before it)"
               if self.before_trouble is not None else "")
        return RunVerdict(DEGRADED, f"the run was halted{at} and did not go past the "
                          f"trouble{began}{was}", start, self.before_trouble,
                          statistics.median(self.recent) if self.recent else math.nan,
                          self.trouble_step, halt_step)

    def _final_tail(self) -> list[float]:
        """The losses the run ended on: the last `window`, or, when trouble began among them,
        those from its first step on (at least `MIN_TAIL`). The median of the last 20 losses
        hides trouble in fewer than 10 of them: a run stopped 9 steps into a divergence is not
        back on its level because 11 losses from before it are."""
        recent = list(self.recent)
        if not self.recent_steps:
            return recent
        first = self.recent_steps[0]
        inside = [t for t in self.trouble_steps if t >= first]
        if not inside:
            return recent
        since = [loss for step, loss in zip(self.recent_steps, recent, strict=True)
                 if step >= min(inside)]
        return since if len(since) >= MIN_TAIL else recent

    def state_dict(self) -> dict[str, Any]:
        return {"first": self.first, "recent": list(self.recent),
                "recent_steps": list(self.recent_steps),
                "trouble_steps": list(self.trouble_steps),
                "before_trouble": self.before_trouble, "trouble_step": self.trouble_step,
                "nonfinite_tail": self.nonfinite_tail, "start": list(self.start),
                "trouble_at_start": self.trouble_at_start,
                "best": self.best, "seen": self.seen, "history": list(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.recent = deque((float(v) for v in state["recent"]), maxlen=self.window)
        before = state.get("before_trouble")
        self.before_trouble = None if before is None else float(before)
        trouble = state.get("trouble_step")
        self.trouble_step = None if trouble is None else int(trouble)
        self.nonfinite_tail = int(state.get("nonfinite_tail", 0))
        self.trouble_at_start = bool(state.get("trouble_at_start", False))
        self.start = [float(v) for v in state.get("start", state["first"])]
        best = state.get("best")
        self.best = None if best is None else float(best)
        self.seen = int(state.get("seen", len(self.recent)))
        self.history = deque((float(v) for v in state.get("history", self.recent)),
                             maxlen=self.stall_steps)
        steps = [int(v) for v in state.get("recent_steps", [])]
        # a state from before the steps were kept: none, and the verdict reads every recent loss
        self.recent_steps = deque(steps if len(steps) == len(self.recent) else [],
                                  maxlen=self.window)
        self.trouble_steps = deque((int(v) for v in state.get("trouble_steps", [])),
                                   maxlen=self.window)
