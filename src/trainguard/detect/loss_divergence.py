"""`loss_divergence`: a sustained upward trend of the loss.

Two levels, in log space. The *best* level is slow and robust: the lowest value of a
bias-corrected exponential moving average (span `detectors.loss_divergence.span`; until it has seen
many steps it is close to the plain mean, so one unlucky first batch does not set it), or the median
of the warm-up's losses if lower (a run that blows up in its first steps and stays up diverges
too). The *current* level is fast: the median of the last `detectors.loss_divergence.window` losses,
which one outlier batch cannot move. The run diverges when the current level stays
`detectors.loss_divergence.ratio` above the best, and more than `detectors.loss_divergence.zscore`
times the run's own noise (the robust spread of its step-to-step changes, which a trend does not
inflate, so a noisy run needs a clearer rise), for `detectors.loss_divergence.patience` consecutive
steps after `warmup_steps`. A loss that climbs gradually is reported about
`divergence_window / 2 + divergence_patience` steps after it crossed the ratio. A rise within float
noise at the scale the loss started at (`detectors.common.loss_resolution` of it) is none, however
large its ratio near zero.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from typing import Any

import numpy as np

from trainguard.detect.base import Detector, Episode
from trainguard.detect.calm import SignalColumns, window_medians
from trainguard.detect.settings import DetectorConfig
from trainguard.events import Event
from trainguard.signals import (
    LossOrigin,
    RobustBaseline,
    StepSignals,
    safe_log,
    settled_at,
    sorted_median,
)


class LanePlan:
    """`LossDivergence.calm_plan`: the levels `check` compares, carried over the steps the lane
    takes (the moving average and the best level recursed as `check` recurses them, the window's
    median kept sorted), so that a step which could count towards a divergence (its window's
    median `ratio` above the best) is known before it is taken."""

    def __init__(self, detector: LossDivergence) -> None:
        self.raw, self.seen, self.best = detector.raw, detector.seen, detector.best
        self.recent = deque(detector.recent, maxlen=detector.recent.maxlen)
        self.ordered = sorted(self.recent)
        self.margin = math.log(detector.config.loss_divergence.ratio)
        self.decay = 1.0 - 2.0 / (detector.config.loss_divergence.span + 1)

    def admits(self, loss: float) -> bool:
        """Whether a step of this loss keeps the plan (and, when it does, is taken into it):
        its window's median stays under `ratio` times the best level (a loss whose log is not
        finite, which `check` passes over, keeps it)."""
        value = safe_log(loss)
        if not math.isfinite(value):
            return True
        decay, margin, seen = self.decay, self.margin, self.seen
        capped = min(value, self.raw / (1.0 - decay ** seen) + 2 * margin) if seen else value
        raw = decay * self.raw + (1 - decay) * capped
        best = min(self.best, raw / (1.0 - decay ** (seen + 1)))
        ordered = self.ordered
        dropped = self.recent[0] if len(self.recent) == self.recent.maxlen else None
        if dropped is not None:
            del ordered[bisect.bisect_left(ordered, dropped)]
        bisect.insort(ordered, value)
        if not sorted_median(ordered) - best < margin:
            del ordered[bisect.bisect_left(ordered, value)]
            if dropped is not None:
                bisect.insort(ordered, dropped)
            return False
        self.recent.append(value)
        self.raw, self.seen, self.best = raw, seen + 1, best
        return True


class LossDivergence(Detector):
    kind = "loss_divergence"
    budget_us = 20.0  # the best loss and the median of its window, every step
    reads = frozenset({"loss", "loss_curvature"})

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.raw = 0.0
        """Exponential moving sum without bias correction (starts at 0, like Adam's moments)."""
        self.seen = 0
        self.best = math.inf
        self.above = 0
        self.start: list[float] = []
        """Log losses of the warm-up steps (their median is where the run started)."""
        self.recent: deque[float] = deque(maxlen=config.loss_divergence.window)
        self.noise = RobustBaseline(config.common.baseline_window, config.common.min_log_scale)
        self.bends: list[float] = []
        """The loss curvature of the last `detectors.loss_divergence.patience` steps."""
        self.episode = Episode(config.common.rearm_steps)
        self.origin = LossOrigin(config.common.warmup_steps, config.common.loss_resolution)

    def smoothed(self) -> float:
        decay = 1.0 - 2.0 / (self.config.loss_divergence.span + 1)
        return self.raw / (1.0 - decay ** self.seen)

    def check(self, signals: StepSignals) -> list[Event]:
        cfg = self.config
        if signals.loss is None:
            return []
        log_loss = safe_log(signals.loss)
        if not math.isfinite(log_loss):
            return []
        self.origin.observe(signals.loss)
        margin = math.log(cfg.loss_divergence.ratio)
        if signals.loss_curvature is not None:  # the guide's second derivative, as evidence
            self.bends = [*self.bends[-(cfg.loss_divergence.patience - 1):], signals.loss_curvature]
        if self.recent:  # step-to-step changes: their spread is the noise, whatever the trend
            self.noise.admit(log_loss - self.recent[-1])
        self.recent.append(log_loss)
        if self.seen:
            log_loss = min(log_loss, self.smoothed() + 2 * margin)
        decay = 1.0 - 2.0 / (cfg.loss_divergence.span + 1)
        self.raw = decay * self.raw + (1 - decay) * log_loss
        self.seen += 1
        ema = self.smoothed()
        if self.seen <= cfg.common.warmup_steps:
            self.start.append(log_loss)
            return []
        # the warm-up's median: where the run started
        if len(self.start) == cfg.common.warmup_steps:
            self.best = min(self.best, statistics.median(self.start))
            self.start.append(math.inf)  # counted once
        self.best = min(self.best, ema)
        level = statistics.median(self.recent)
        rise = level - self.best
        noise = self.noise.stats()[1] / math.sqrt(2) if len(self.noise) else 0.0
        self.above = (self.above + 1
                      if rise >= margin and rise >= cfg.loss_divergence.zscore * noise
                      and not self.origin.negligible(math.exp(level) - math.exp(self.best))
                      else 0)
        if not self.episode.update(self.above >= cfg.loss_divergence.patience):
            return []
        crossed = signals.step - self.above - len(self.recent) // 2
        bends = self.bends[-self.above:]
        accelerating = bool(bends) and sum(1 for c in bends if c > 0) >= 0.6 * len(bends)
        return [self.event(signals.step, "error",
                           f"the loss (median of the last {len(self.recent)} steps, "
                           f"{math.exp(level):.4g}) has stayed above "
                           f"{cfg.loss_divergence.ratio:g}x "
                           f"its best {math.exp(self.best):.4g} for {self.above} steps",
                           value=math.exp(level), ratio=math.exp(rise),
                           best=math.exp(self.best), crossed=max(crossed, 0),
                           accelerating=accelerating)]

    live_in_lane = True

    def calm_plan(self) -> LanePlan | None:
        """For the calm lane, at its opening: a plan under which the steps it takes need no
        `check` of their own until they are handed over (`skip_calm` then moves the state past
        them exactly). A step counts towards a divergence only when the median of the last
        `window` log losses is `ratio` above the best level (and far outside the noise): the
        plan follows those two levels as `check` would and refuses a step that reaches it.
        None: the warm-up is not over, or a rise or an episode is under way."""
        if (self.above or self.episode.active or self.seen <= self.config.common.warmup_steps
                or not self.recent):
            return None
        return LanePlan(self)

    def calm_at(self, signals: StepSignals) -> bool:
        """A divergence is a level up `patience` steps in a row: a step that cannot complete
        the count raises nothing."""
        return (not self.episode.active
                and self.above + 1 < self.config.loss_divergence.patience)

    def skip_calm(self, columns: SignalColumns, start: int, end: int) -> int:
        """Calm rows: no loss, or one that is not finite or not positive, or one whose median
        of the last `window` losses stays under `ratio` times the best level. Taken once the
        warm-up is over, the window full and no rise or episode is under way. The moving
        average is a recursion, carried row by row as `check` carries it; the medians are taken
        at once."""
        cfg = self.config
        window = cfg.loss_divergence.window
        if (self.above or self.episode.active or len(self.start) <= cfg.common.warmup_steps
                or len(self.recent) < window or not self.origin.full):
            return start
        end = columns.chunk(start, end, window)
        logs = columns.log_loss()[start:end]
        judged = np.isfinite(logs)
        values = logs[judged]
        history = np.fromiter(self.recent, dtype=np.float64, count=len(self.recent))
        levels = window_medians(history, values, window, including=True).tolist()
        margin = math.log(cfg.loss_divergence.ratio)
        decay = 1.0 - 2.0 / (cfg.loss_divergence.span + 1)
        raw, seen, best = self.raw, self.seen, self.best
        gain, cap = 1 - decay, 2 * margin
        exact = settled_at(decay)  # from there on the moving average needs no correction
        stop = 0
        for log_loss, level in zip(values.tolist(), levels, strict=True):
            if seen < exact:
                smoothed = raw / (1.0 - decay ** seen)
                next_raw = decay * raw + gain * min(log_loss, smoothed + cap)
                next_best = min(best, next_raw / (1.0 - decay ** (seen + 1)))
            else:  # smoothed() is raw itself (the same min() as check's, spelt out: faster)
                next_raw = decay * raw + gain * (raw + cap if raw + cap < log_loss else log_loss)
                next_best = next_raw if next_raw < best else best
            if level - next_best >= margin:
                break
            raw, best = next_raw, next_best
            stop += 1
            seen += 1
        self.raw, self.seen, self.best = raw, seen, best
        if stop < len(values):
            end = start + int(np.flatnonzero(judged)[stop])
        if not stop:
            return end
        taken = values[:stop]
        self.noise.admit_all(np.diff(np.concatenate([history[-1:], taken])), stats_first=False)
        self.recent.extend(taken.tolist())
        rows = np.flatnonzero(judged)[:stop] + start
        bends = columns.loss_curvature[rows][columns.has_curvature[rows]].tolist()
        keep = cfg.loss_divergence.patience
        self.bends = [*self.bends, *bends][-keep:] if keep > 1 else [*self.bends, *bends]
        return end

    def state_dict(self) -> dict[str, Any]:
        return {"raw": self.raw, "seen": self.seen, "best": self.best, "above": self.above,
                "start": list(self.start), "recent": list(self.recent),
                "noise": self.noise.state_dict(), "bends": list(self.bends),
                "episode": self.episode.state_dict(), "origin": self.origin.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.raw = float(state["raw"])
        self.seen = int(state["seen"])
        self.best = float(state["best"])
        self.above = int(state["above"])
        self.start = [float(v) for v in state.get("start", [])]
        self.recent = deque((float(v) for v in state.get("recent", [])),
                            maxlen=self.config.loss_divergence.window)
        if "noise" in state:
            self.noise.load_state_dict(state["noise"])
        self.bends = [float(v) for v in state.get("bends", [])]
        self.episode.load_state_dict(state["episode"])
        self.origin.load_state_dict(state.get("origin", {}))
