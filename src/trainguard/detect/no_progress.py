"""`no_progress`: the run has trained long enough to tell, and its loss has not come down.

Judged once, after `stall_steps` optimizer steps (counted from the last time the LR rose 10%
above its highest, so a warm-up does not count; steps at LR 0 count, a run at LR 0 does not
train): the median of the last `STALL_WINDOW` finite losses against the median of the first
ones. The loss has come down when it fell by more than its own noise at the start (one standard
deviation of the first losses, robustly) and by more than `STALL_SHARE` of its start level, or
when it is coming down over the steps judged (a significant downward Kendall trend: a slow
learner on heavy-tailed data); a run that did neither, and shows no hint of a downward trend
(else it is judged again `stall_steps` later), is not learning, provided its noise at the start
was small enough to tell (`judgeable`: at most a tenth of its level; a loss dominated by its
data's noise, at its floor from the first steps, is never called stalled). A run that learned
and then plateaued came down: no stall.

The event names what the run shows of why (`details["cause"]`, the cause code it points at;
absent when it shows none):

- its gradient norm collapsed by `GRAD_COLLAPSE` or more from its early level while the loss
  stayed flat: updates too large killed the network (dead units, saturated outputs), the LR is
  far too high;
- else the evidence of the steps judged (`detect/stall_reason.py`): no gradient at all, the LR
  at 0, updates too small to move the weights, most weights frozen, or a loss at chance level
  while the weights move and the gradients flow (labels that carry no signal).

A loss of exactly 0 from the start (a model that already fits its data) is not stalled.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

from trainguard.detect.base import Detector
from trainguard.detect.settings import DetectorConfig
from trainguard.detect.stall_reason import StallEvidence, StallReason, run_lr
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
    reads = frozenset({"amp_overflow", "grad_norm", "group_lrs", "loss", "lr", "param_grad_norm",
                       "param_names", "sampled"})
    live_only = True

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.start: list[float] = []
        self.recent: deque[float] = deque(maxlen=STALL_WINDOW)
        self.history: deque[float] = deque(maxlen=config.no_progress.steps)
        """The losses of the working steps judged (bounded by `stall_steps`)."""
        self.grad_start: list[float] = []
        self.grad_recent: deque[float] = deque(maxlen=STALL_WINDOW)
        self.top_lr = 0.0
        self.working_steps = 0
        self.evidence = StallEvidence()
        """What the steps judged show of why (`detect/stall_reason.py`)."""
        self.done = False
        self.reason = ""
        """What the stall showed of why, once judged stalled (the verdict repeats it)."""
        self.decay: float | None = None
        """The share of every weight a step that a weight decay the preflight found too strong
        takes (its `weight_decay` finding), which the reason weighs; None: none found."""

    live_in_lane = True

    def calm_at(self, signals: StepSignals) -> bool:
        """Judged once, at the `steps`-th working step: any step before it raises nothing."""
        return self.done or self.working_steps + 1 < self.config.no_progress.steps

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
        lr = run_lr(signals)
        working = lr is None
        if lr is not None and math.isfinite(lr) and lr >= 0:
            if lr > RISING * self.top_lr:  # still warming up: the count starts again
                self.top_lr = lr
                self.working_steps = 0
                self.history.clear()
                self.evidence.clear()
            else:  # LR 0 included: a run that never trains is judged like any other
                working = True
        if working:
            self.working_steps += 1
            self.evidence.see(signals, lr)
            if loss is not None and math.isfinite(loss):
                self.history.append(loss)
        if (self.working_steps < self.config.no_progress.steps or len(self.start) < STALL_WINDOW
                or len(self.recent) < STALL_WINDOW):
            return []
        history = list(self.history)
        if (progressed(self.start, list(self.recent), history)
                or all(v == 0 for v in self.start) or not judgeable(self.start)):
            self.done = True
            return []
        if not flat(self.start, list(self.recent), history):  # a hint: judge again later
            self.working_steps = 0
            self.evidence.clear()
            return []
        self.done = True
        start, now = statistics.median(self.start), statistics.median(self.recent)
        reason = self._reason(signals, history)
        self.reason = reason.text
        cause = {"cause": reason.cause} if reason.cause else {}
        return [self.event(signals.step, "warning",
                           f"the loss has not come down in {self.working_steps} steps (median "
                           f"{now:.4g}, from {start:.4g} at the start): {reason.text}",
                           value=now, start=start, steps=self.working_steps, reason=reason.text,
                           **cause, **reason.details)]

    def _reason(self, signals: StepSignals, history: list[float]) -> StallReason:
        """Why, as far as the run shows: a collapsed gradient norm first (measured directly),
        else the evidence of the steps judged."""
        if len(self.grad_start) >= STALL_WINDOW // 2 and self.grad_recent:
            early, late = statistics.median(self.grad_start), statistics.median(self.grad_recent)
            if late > 0 and early / late >= GRAD_COLLAPSE:
                return StallReason("lr_too_high", f"its gradient norm fell {early / late:.3g}x "
                                   f"from {early:.3g} while it stayed flat: updates too large "
                                   "killed the network (LR far too high)",
                                   {"grad_collapse": early / late})
        return self.evidence.explain(list(self.recent), signals.param_names, signals.group_lrs,
                                     trend_z(history), decay=self.decay)

    def state_dict(self) -> dict[str, Any]:
        return {"start": list(self.start), "recent": list(self.recent),
                "history": list(self.history),
                "grad_start": list(self.grad_start), "grad_recent": list(self.grad_recent),
                "top_lr": self.top_lr, "working_steps": self.working_steps, "done": self.done,
                "evidence": self.evidence.state_dict(), "reason": self.reason,
                "decay": self.decay}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start = [float(v) for v in state.get("start", [])]
        self.recent = deque((float(v) for v in state.get("recent", [])), maxlen=STALL_WINDOW)
        self.history = deque((float(v) for v in state.get("history", [])),
                             maxlen=self.config.no_progress.steps)
        self.grad_start = [float(v) for v in state.get("grad_start", [])]
        self.grad_recent = deque((float(v) for v in state.get("grad_recent", [])),
                                 maxlen=STALL_WINDOW)
        self.top_lr = float(state.get("top_lr", 0.0))
        self.working_steps = int(state.get("working_steps", 0))
        self.done = bool(state.get("done", False))
        self.evidence = StallEvidence()
        self.evidence.load_state_dict(state.get("evidence", {}))
        self.reason = str(state.get("reason", ""))
        decay = state.get("decay")
        self.decay = float(decay) if isinstance(decay, (int, float)) else None
