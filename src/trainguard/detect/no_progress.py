"""`no_progress`: the run has trained long enough to tell, and its loss has not come down.

Judged once, after `stall_steps` optimizer steps taken at a working learning rate (counted from
the last time the LR rose 10% above its highest, so a warm-up does not count): the median of the
last `STALL_WINDOW` finite losses against the median of the first ones. The loss has come down
when it fell by more than its own noise at the start (one standard deviation of the first
losses, robustly) and by more than `STALL_SHARE` of its start level, or when it is coming down
over the steps judged (a significant downward Kendall trend: a slow learner on heavy-tailed
data); a run that did neither, and shows no hint of a downward trend (else it is judged again
`stall_steps` later), is not learning, provided its noise at the start was small enough to tell
(`judgeable`: at most a tenth of its level; a loss dominated by its data's noise, at its floor
from the first steps, is never called stalled):

- its gradient norm collapsed by `GRAD_COLLAPSE` or more from its early level while the loss
  stayed flat: updates too large killed the network (dead units, saturated outputs), the LR is
  far too high;
- the loss carries no gradient (computed under `torch.no_grad()`, every parameter frozen; the
  `no_gradients` event says so too);
- or the LR is far too low to move anything.

A loss of exactly 0 from the start (a model that already fits its data) is not stalled.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

from trainguard.config import DetectorConfig
from trainguard.detect.base import Detector
from trainguard.events import Event
from trainguard.signals import MAD_TO_STD, StepSignals

STALL_WINDOW = 20
"""Losses in the start level and in the recent level (medians)."""
STALL_SHARE = 0.02
"""A loss that fell by less than this share of its start has not come down."""
GRAD_COLLAPSE = 100.0
"""A gradient norm this many times below its early level has collapsed."""
NOISE_SHARE = 0.1
"""A stall is claimed only where the start's noise is at most this share of its level."""
RISING = 1.1
"""Steps before the LR last rose this much above its highest (a warm-up) do not count."""


TREND_Z = 3.0
"""A downward trend counts when its Kendall tau is this many standard errors below 0..."""
FLAT_Z = 1.0
"""...and a loss is flat only when its trend is within this many standard errors of none: in
between, a slow learner on noisy data is judged again `stall_steps` later."""


def trend_z(values: list[float]) -> float:
    """Kendall's tau between step and loss, in standard errors of a trendless series (negative:
    the loss falls). 0 for fewer than 10 values."""
    n = len(values)
    if n < 10:
        return 0.0
    concordant = 0
    for i in range(n):
        a = values[i]
        for b in values[i + 1:]:
            concordant += int(b > a) - int(b < a)
    tau = concordant / (n * (n - 1) / 2)
    return tau / math.sqrt(2 * (2 * n + 5) / (9 * n * (n - 1)))


def _share(start: list[float], recent: list[float]) -> float:
    """How far the loss fell, as a share of its start level."""
    level = statistics.median(start)
    return (level - statistics.median(recent)) / abs(level) if level else 0.0


def progressed(start: list[float], recent: list[float], history: list[float]) -> bool:
    """The rule `no_progress` and the run's verdict (`stalled`) share: the loss came down
    (`came_down`), or it is coming down steadily over `history` (the losses of the span judged:
    a Kendall trend `TREND_Z` standard errors below none) by `STALL_SHARE` of its start or more
    (a slow learner on heavy-tailed data, too noisy for two medians to tell)."""
    return came_down(start, recent) or (
        trend_z(history) <= -TREND_Z and _share(start, recent) >= STALL_SHARE)


def flat(start: list[float], recent: list[float], history: list[float]) -> bool:
    """No hint of learning: no downward trend within `FLAT_Z` standard errors, or a fall below
    `STALL_SHARE` of the start however steady. What a stall needs besides no progress; a run in
    between is judged again later."""
    return trend_z(history) > -FLAT_Z or _share(start, recent) < STALL_SHARE


def judgeable(start: list[float]) -> bool:
    """Whether a stall can be told at all: the losses' own noise at the start is at most
    `NOISE_SHARE` of their level, so a fall of that much would have stood out. A loss dominated
    by its data's noise (heavy-tailed targets, where a model at its floor from its first steps
    looks the same as one that learned nothing) is never called stalled."""
    level = statistics.median(start)
    spread = MAD_TO_STD * statistics.median(abs(v - level) for v in start)
    return spread <= NOISE_SHARE * abs(level)


def came_down(start: list[float], recent: list[float]) -> bool:
    """The loss fell beyond its own noise at the start and by more than `STALL_SHARE` of it:
    the rule `no_progress` and the run's verdict (`stalled`) share."""
    level = statistics.median(start)
    spread = MAD_TO_STD * statistics.median(abs(v - level) for v in start)
    now = statistics.median(recent)
    return level - now > max(spread, STALL_SHARE * abs(level))


class NoProgress(Detector):
    kind = "no_progress"
    reads = frozenset({"amp_overflow", "grad_norm", "loss", "lr"})
    live_only = True

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.start: list[float] = []
        self.recent: deque[float] = deque(maxlen=STALL_WINDOW)
        self.history: deque[float] = deque(maxlen=config.stall_steps)
        """The losses of the working steps judged (bounded by `stall_steps`)."""
        self.grad_start: list[float] = []
        self.grad_recent: deque[float] = deque(maxlen=STALL_WINDOW)
        self.top_lr = 0.0
        self.working_steps = 0
        self.done = False

    def check(self, signals: StepSignals) -> list[Event]:
        if self.done:
            return []
        loss = signals.loss
        if loss is not None and math.isfinite(loss):
            if len(self.start) < STALL_WINDOW:
                self.start.append(loss)
            self.recent.append(loss)
        grad = signals.grad_norm
        if math.isfinite(grad) and grad > 0 and not signals.amp_overflow:
            if len(self.grad_start) < STALL_WINDOW:
                self.grad_start.append(grad)
            self.grad_recent.append(grad)
        lr = signals.lr
        working = lr is None
        if lr is not None and math.isfinite(lr) and lr > 0:
            if lr > RISING * self.top_lr:  # still warming up: the count starts again
                self.top_lr = lr
                self.working_steps = 0
                self.history.clear()
            else:
                working = True
        if working:
            self.working_steps += 1
            if loss is not None and math.isfinite(loss):
                self.history.append(loss)
        if (self.working_steps < self.config.stall_steps or len(self.start) < STALL_WINDOW
                or len(self.recent) < STALL_WINDOW):
            return []
        history = list(self.history)
        if (progressed(self.start, list(self.recent), history)
                or all(v == 0 for v in self.start) or not judgeable(self.start)):
            self.done = True
            return []
        if not flat(self.start, list(self.recent), history):  # a hint: judge again later
            self.working_steps = 0
            return []
        self.done = True
        start, now = statistics.median(self.start), statistics.median(self.recent)
        collapse = None
        if len(self.grad_start) >= STALL_WINDOW // 2 and self.grad_recent:
            early, late = statistics.median(self.grad_start), statistics.median(self.grad_recent)
            if late > 0 and early / late >= GRAD_COLLAPSE:
                collapse = early / late
        early_grad = statistics.median(self.grad_start) if self.grad_start else math.nan
        why = (f"; its gradient norm fell {collapse:.3g}x from {early_grad:.3g} while it stayed "
               "flat: updates too large killed the network (LR far too high)"
               if collapse is not None else
               ": the LR may be far too high or far too low, parameters frozen, or the loss "
               "detached from the weights")
        return [self.event(signals.step, "warning",
                           f"the loss has not come down in {self.working_steps} steps (median "
                           f"{now:.4g}, from {start:.4g} at the start){why}", value=now,
                           start=start, grad_collapse=collapse, steps=self.working_steps)]

    def state_dict(self) -> dict[str, Any]:
        return {"start": list(self.start), "recent": list(self.recent),
                "history": list(self.history),
                "grad_start": list(self.grad_start), "grad_recent": list(self.grad_recent),
                "top_lr": self.top_lr, "working_steps": self.working_steps, "done": self.done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start = [float(v) for v in state.get("start", [])]
        self.recent = deque((float(v) for v in state.get("recent", [])), maxlen=STALL_WINDOW)
        self.history = deque((float(v) for v in state.get("history", [])),
                             maxlen=self.config.stall_steps)
        self.grad_start = [float(v) for v in state.get("grad_start", [])]
        self.grad_recent = deque((float(v) for v in state.get("grad_recent", [])),
                                 maxlen=STALL_WINDOW)
        self.top_lr = float(state.get("top_lr", 0.0))
        self.working_steps = int(state.get("working_steps", 0))
        self.done = bool(state.get("done", False))
