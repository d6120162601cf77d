"""`instability_precursor`: a warning before the loss spikes, from Adam's second moment lagging.

Reads `adam_ratio_rms` (`probes/adam_ratio.py`): per watched parameter, the gradient's RMS over
the RMS of sqrt(v_hat), sqrt(sum g^2 / sum v_hat). The probes measure at a cadence
(`detectors.instability_precursor.every`, `due`): every step near a bound, after an event and on
sampled steps, else every few steps; a step in between is judged on an estimate, the ratio last
measured scaled by how each parameter's gradient norm (on the host every step) moved since, since
Adam's second moment is a long average that a few steps hardly move (while each measurement
matches the estimate made for it, the ratio is measured at every second due step, then every fourth,
then every eighth: `ratio_due`, `hold`; log Z keeps the cadence). Each parameter is compared
with its own median over the last `baseline_window` steps (a steady run sits near 1, some
parameters a little above). When a parameter's ratio is `detectors.instability_precursor.ratio`
times its median, `detectors.instability_precursor.zscore` robust standard deviations of its own log
ratio above it (heavy-tailed data makes single parameters' ratios swing with every batch), and at
least `detectors.instability_precursor.abs_min`, for `detectors.instability_precursor.steps` steps
in a row, while its median over the last `detectors.instability_precursor.trend_window` steps is
already above the long one (a level creeping up, not a burst), the gradient is outgrowing what Adam
has seen of it. That is what comes before a loss spike when the LR is past what the weights can take
(the update directions Adam normalises by a stale v), and when a parameter whose v decayed gets a
large gradient again (Wortsman et al. 2023, arXiv 2304.13013: spikes 1-8 steps after). The event
names the parameter (the layer), the signal's level against its median, its trend against its value
before the steps above (`detect/trend.py`, that value named) and the lead to expect; it stays silent
while the baseline is young (`detectors.instability_precursor.warmup` steps with a ratio measured:
steps where every parameter reads 0, Adam without state yet while a GradScaler skips its first
steps, do not count) and reports an episode once.

Values above the threshold enter the baseline capped at it, so a lasting rise is learned slowly
and one burst does not lift the level it is compared with.

Four rises are not the weights going wrong, and are taken off or left out first:
- the clip's: the probe's g is the gradient before clipping, while v was fed the clipped
  gradients the optimizer was given; a norm above the clip limit in force (`clip_limit`, such as
  a Trainer's `clip.max_grad_norm=1.0` on a regression head whose norm sits above 1) lifts the ratio
  by norm / limit, which Adam never sees: the ratio is judged at the clipped gradient;
- the batch's: a batch with fewer elements than the typical one has a noisier gradient
  (length curricula, `group_by_length`), and a batch whose loss is above the typical one (a
  heavy-tailed draw) steeper slopes (`detect/batch_noise.py`);
- the schedule's: Adam's update is the LR times the ratio, so a ratio that rises while the LR
  has come down below its recent median (a linear decay's last steps) is judged at the update it
  makes, times the LR over that median;
- learning's: while the loss is still coming down (`OutputGrowth.learning`, as for log Z), a
  model that starts to use a layer grows its gradients faster than Adam's average of them; a
  gradient that outgrows v while the loss stays put is what comes before the spike.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainguard.detect.aftermath import AHEAD, Aftermath
from trainguard.detect.attention_logits import AttentionLogitTracker
from trainguard.detect.base import Detector, Episode
from trainguard.detect.batch_noise import BatchNoise
from trainguard.detect.columns import column_medians
from trainguard.detect.output_growth import LOGZ, LOGZ_MEAN, NEAR, UPDATE, OutputGrowth
from trainguard.detect.settings import DetectorConfig
from trainguard.detect.trend import since, trend
from trainguard.events import Event
from trainguard.signals import MAD_TO_STD, StepSignals

SIGNAL = "adam_ratio_rms"
EXPECTED_LEAD = "~10"
"""The lead the message announces: on the scenario suite's `tiny_lm` family the warning came 4-19
steps before the loss first doubled, median 11 over 6 seeds (`benchmarks/precursors.py`)."""


def _last_finite(values: np.ndarray) -> np.ndarray:
    """Each column's last finite value (NaN for a column of none)."""
    rows = np.where(np.isfinite(values), np.arange(len(values))[:, None], -1).max(axis=0)
    picked = values[np.maximum(rows, 0), np.arange(values.shape[1])]
    return np.where(rows >= 0, picked, np.nan)


def clip_factor(signals: StepSignals) -> float:
    """The factor the global clip in force scales the step's gradients by before the optimizer
    is given them (1.0 without clipping, or when the norm is not finite)."""
    limit, norm = signals.clip_limit, signals.grad_norm
    if limit is None or not (math.isfinite(norm) and norm > limit > 0):
        return 1.0
    return limit / norm


HOLD_MAX = 8
"""A ratio whose estimates keep matching what the probe then measures is measured every up to
this many times `every` steps (doubling with each match): Adam's sum v, the probe's only cost
beyond the gradient norms, is summed less often while the estimate is shown to hold. (8, up from
4: the MLP's measured steps 280 -> 200 of 3000, the sampled ones included, 27-31 us a step less;
`benchmarks/precursors.py`'s leads and healthy runs unchanged.)"""
HOLD_MATCH = math.log(1.05)
"""A measured ratio within this (log) of its estimate from the measurement before is a match."""

SAID_DISCOUNT = 1.05
"""What the batch explains is told from this share of the rise on (a loss 1.003x the typical one
took off 1.0017x and read "once the 1x that its batch explains ... is taken off")."""

@dataclass(slots=True, eq=False)
class SkippedSteps:
    """The calm lane's plan for the steps the precursor probes skip (`skipped_steps`), and for
    those where they measure log Z alone, and the steps it took on it, until
    `InstabilityPrecursor.stand` hands them over. With no streak or episode open, and the ratio
    last measured standing in for each parameter, such a step is quiet when every estimate
    (`per_norm` times its gradient norm; the lane's steps are never clipped) is under `bound`;
    whatever the estimate, its episode stays closed and `near` stays as it was. A step whose
    log Z was measured is quiet for it too when its largest log Z is under `logz_floor` (the
    lowest log Z kept at the plan, or a lower one taken on it since) plus `logz_margin`: under
    every lowest value the baseline holds until then plus the margin at which `near` would
    turn, so `check` would take its quiet path and leave `near` as it was (`logz_floor` None:
    such a step is the precursor's own, as every measurement of the ratio is)."""

    per_norm: np.ndarray | None
    """The precursor's `per_norm` (None: no estimate yet, every such step is quiet)."""
    bound: float
    logz_floor: float | None = None
    logz_margin: float = 0.0
    losses: list[float] = field(default_factory=list)
    """The losses of the steps taken, in order."""
    logz: list[tuple[int, np.ndarray, float] | None] = field(default_factory=list)
    """For each step taken, in order: (the steps before it the probes skipped, its largest log
    Z as measured, its mean log Z) where log Z was measured, None where it was not."""
    count: int = 0
    peak: float | None = None
    """The largest estimate of the last step taken (None: no estimate)."""

    def quiet(self, norms: np.ndarray) -> tuple[bool, float | None]:
        """Whether a step with these gradient norms is quiet, and its peak estimate."""
        per_norm = self.per_norm
        if per_norm is None or per_norm.shape != norms.shape:
            return True, None
        peak = float(np.fmax.reduce(per_norm * norms, initial=0.0))
        return peak < self.bound, peak

    def logz_row(self, precursors: dict[str, Any]) -> tuple[np.ndarray, float] | None:
        """A step where the probes measured log Z alone, quiet for it on the plan: (its largest
        log Z, its mean); None when the step is not one (the ratio measured too, no plan for
        log Z, or a value at or above the bound or not finite)."""
        floor = self.logz_floor
        if (floor is None or LOGZ not in precursors or LOGZ_MEAN not in precursors
                or SIGNAL in precursors or UPDATE in precursors):
            return None
        value = np.asarray(precursors[LOGZ], dtype=np.float64).reshape(-1)[:1]
        first = float(value[0])  # (`check` keeps a non-finite value as NaN: not the plan's)
        if not (math.isfinite(first) and first < floor + self.logz_margin):
            return None
        mean = float(np.asarray(precursors[LOGZ_MEAN], dtype=np.float64).reshape(-1)[0])
        return value, mean

    def keep(self, loss: float, peak: float | None,
             logz: tuple[int, np.ndarray, float] | None = None) -> None:
        self.losses.append(loss)
        self.logz.append(logz)
        if logz is not None and self.logz_floor is not None:
            self.logz_floor = min(self.logz_floor, float(logz[1][0]))
        self.count += 1
        self.peak = peak


class InstabilityPrecursor(Detector):
    kind = "instability_precursor"
    budget_us = 100.0  # a ratio per parameter, estimated on the steps the probe skips
    reads = frozenset({"param_names", "precursors", "attention_logits", "lr", "loss",
                       "batch_elements", "grad_norm", "clip_limit"})
    raises_from = frozenset({"precursors", "attention_logits"})

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.history: deque[np.ndarray] = deque(maxlen=config.common.baseline_window)
        self.streak = np.zeros(0, dtype=np.int64)
        self.streaking = False
        """Some parameter's streak is running (`streak` has a count): kept with it, as every
        quiet step asks."""
        self.first: np.ndarray = np.zeros(0)
        """Each parameter's ratio before its current streak began: its last finite value kept
        (for the trend)."""
        self.sudden = np.zeros(0, dtype=bool)
        """Whether each parameter's current streak started with a jump (it does not count)."""
        self.episode = Episode(config.common.rearm_steps)
        self.attention = AttentionLogitTracker(config)
        """The attention layers' largest logits (`detect/attention_logits.py`)."""
        self.aftermath = Aftermath()
        """The trouble this detector's warnings would come after (`detect/aftermath.py`)."""
        self.growth = OutputGrowth(config)
        """log Z and Adam's update RMS (`detect/output_growth.py`): events of this kind."""
        self.batch_noise = BatchNoise(config.common.baseline_window)
        """The rise of the ratio that a batch smaller than the typical one explains
        (`detect/batch_noise.py`), taken off before the ratio is judged."""
        self.discount = 0.0
        """This step's log discount for its batch's size."""
        self.clipped = 1.0
        """This step's clip factor: the ratio is judged at the gradient the optimizer is given."""
        self.per_norm: np.ndarray | None = None
        """Each ratio of the last step the probe measured over its gradient norm there (0 for a
        parameter without a gradient, whose ratio is 0): a step it skips is estimated from it
        in one product (`_estimate`); None before a ratio was measured."""
        self.lrs: deque[float] = deque(maxlen=config.common.baseline_window)
        """The LRs of the last steps (`_lr_fall`)."""
        self.lr_fall = 1.0
        """This step's LR over its recent median, when the schedule took it down (else 1)."""
        self.judged = False
        """This step's ratios were judged (measured, or estimated from the gradient norms)."""
        self.last_max = 0.0
        """The largest ratio of the step last measured (as judged: clipped, batch discounted)."""
        self.measured: int | None = None
        """The last step the probes measured (None: none yet)."""
        self.near = False
        """Some value was near its bound at that step: the probes measure every step."""
        self.growth_near = False
        """log Z or the update RMS was near its bound when last measured."""
        self._calm_peak: float | None = None
        """The estimate's peak `calm_at` found on the step it was asked about last."""
        self.ratio_measured: int | None = None
        """The last step the Adam ratio was measured (None: none yet)."""
        self.hold = config.instability_precursor.every
        """How many steps a measured ratio stands for while far from its bound: `every`, doubled
        (up to `HOLD_MAX` times it) each time the estimate matched the next measurement."""

    def due(self, step: int) -> bool:
        """Whether the probes measure `step` (`detectors.instability_precursor.every`): every
        `every` steps while every value is far from its bound, every step near one."""
        cfg = self.config.instability_precursor
        last = self.measured
        return (cfg.every <= 1 or self.near or last is None or step <= last
                or step - last >= cfg.every
                # Adam has no state before its first step: measure until it has
                or (self.per_norm is None and step < cfg.warmup))

    def ratio_due(self, step: int) -> bool:
        """Whether the Adam ratio is measured at `step`, a step `due` says the probes measure:
        at every one of them near the ratio's bound, else once the ratio last measured has
        stood for `hold` steps (log Z, a cheap reduction of the step's logits, keeps `due`'s
        cadence). log Z near its own bound does not bring the ratio in: the estimate from the
        gradient norms stands for it (on the overhead MLP, whose log Z grows as it fits its
        batches, that measured the ratio on one step in eight where its hold was 32)."""
        cfg, last = self.config.instability_precursor, self.ratio_measured
        return (cfg.every <= 1 or self._ratio_near() or last is None or step <= last
                or step - last >= self.hold or self.per_norm is None or cfg.update_rms)

    def measured_at(self, step: int) -> int:
        """The probes measured `step`: it is the last measured, and the steps they skipped
        since the one before (whose values stand for them) are returned."""
        held, self.measured = self._held_at(step), step
        return held

    def _held_at(self, step: int) -> int:
        """The steps the probes skipped between the last they measured and `step`."""
        last = self.measured
        if last is not None and step > last:
            return min(step - last - 1, self.config.common.baseline_window)
        return 0

    def check(self, signals: StepSignals) -> list[Event]:
        # the probes measured this step, or not
        held = self.measured_at(signals.step) if signals.precursors else 0
        events = (self._check_ratio(signals) + self.attention.check(signals, self.event)
                  + self.growth.check(signals, self.event, held))
        if signals.precursors:  # log Z moves only when measured
            self.growth_near = self.growth.near()
        if signals.precursors or self.judged:
            self.near = self.growth_near or self._ratio_near()
        if signals.lr is not None:
            for event in events:  # the LR it came at: the ranking compares it with the first
                event.details.setdefault("lr", signals.lr)  # steps' (a schedule that rose)
        return events

    def _ratio_near(self) -> bool:
        """A parameter's ratio within `NEAR` of `abs_min`, a streak running or an episode open."""
        if self.episode.active or self.streaking:
            return True
        return self.last_max >= NEAR * self.config.instability_precursor.abs_min

    def _check_ratio(self, signals: StepSignals) -> list[Event]:
        measured = signals.precursors.get(SIGNAL)
        self.judged = False
        if measured is not None:
            values = np.asarray(measured, dtype=np.float64)
            self._adapt_hold(signals, values)
            if (values > 0).any():  # a ratio to estimate the steps after from
                norms = np.asarray(signals.param_grad_norm, dtype=np.float64)
                self.per_norm = np.divide(values, norms, out=np.zeros_like(values),
                                          where=norms > 0)
        else:
            estimate = self._estimate(signals)
            if estimate is None:
                return []
            if self._far(estimate, signals):
                return []
            values = estimate
        self.judged = True
        self.clipped = clip_factor(signals)
        values = values * self.clipped
        self.discount = self.batch_noise.log_discount(signals.batch_elements, signals.loss)
        if self.discount:
            values = values * math.exp(-self.discount)
        self.lr_fall = self._lr_fall(signals.lr, values)
        if self.lr_fall < 1.0:
            values = values * self.lr_fall
        if self.streak.shape != values.shape:  # parameters added: start the baselines again
            self.history.clear()
            self.streak = np.zeros(values.shape, dtype=np.int64)
            self.streaking = False
            self.first = np.zeros(values.shape)
            self.sudden = np.zeros(values.shape, dtype=bool)
        # the log of what is finite and positive, NaN else (the log of NaN warns nothing)
        logs = np.log(np.where((values > 0) & (values < math.inf), values, math.nan))
        self.last_max = float(np.fmax.reduce(values, initial=0.0))
        if len(self.history) < self.config.instability_precursor.warmup:
            if np.isfinite(logs).any():  # a step with nothing measured does not age the baseline
                self.history.append(logs)
            return []
        return self._judge(signals, values, logs)

    def _lr_fall(self, lr: float | None, values: np.ndarray) -> float:
        """The step's LR over its median of the last `baseline_window` steps, when below 1 (and
        some ratio could be high): Adam's update is the LR times the ratio, so a ratio that rises
        while the schedule has taken the LR down (a linear decay's last steps, where a gradient
        burst moves the weights little) is judged at the update it makes. 1.0 otherwise."""
        if lr is not None and math.isfinite(lr) and lr > 0:
            self.lrs.append(lr)
        else:
            return 1.0
        if (len(self.lrs) < self.config.instability_precursor.warmup // 2
                or not float(np.fmax.reduce(values, initial=0.0))
                >= self.config.instability_precursor.abs_min):
            return 1.0
        typical = float(np.median(self.lrs))
        return min(1.0, lr / typical) if typical > 0 else 1.0

    live_in_lane = True

    def calm_at(self, signals: StepSignals) -> bool:
        """Whether `check` is sure to raise nothing on this step, known before it runs (the
        calm lane asks, then runs `take_calm`): with no streak or episode open, a step whose
        ratios (measured, or the estimate of a step the probes skip), at the clipped gradient,
        are under `abs_min` (the estimate under `NEAR` of it: `_far`'s quiet step, taken
        without `check`) and whose log Z may not warn (`OutputGrowth.calm_at`). False when it
        may raise, or when that is not known cheaply."""
        if signals.attention_logits:
            return False
        cfg = self.config.instability_precursor
        self._calm_peak = None
        measured = signals.precursors.get(SIGNAL)
        if signals.precursors and not self.growth.calm_at(signals, self._held_at(signals.step)):
            return False
        if self.streaking or self.episode.active:
            return False
        if measured is None:  # the ratio not measured (log Z may be)
            estimate = self._estimate(signals)
            if estimate is None:
                return True
            peak = float(np.fmax.reduce(estimate, initial=0.0)) * clip_factor(signals)
            if peak < NEAR * cfg.abs_min and self.history:
                self._calm_peak = peak  # what `_far` takes as quiet
                return True
        else:
            measured = np.asarray(measured, dtype=np.float64)
            peak = float(np.fmax.reduce(measured, initial=0.0)) * clip_factor(signals)
        # nothing up to `abs_min` (the discounts only lower the values): `_quiet`, or the
        # baseline still young; `take_calm` runs `check`
        return peak < cfg.abs_min

    def take_calm(self, signals: StepSignals) -> list[Event]:
        """`check` of the step `calm_at` just called calm: on a step the probes skipped, what
        `check` does there (the ratios last judged stand for it, `_far`), without computing the
        estimate again; on a step they measured, or one whose estimate is nearer its bound,
        `check` itself."""
        peak, self._calm_peak = self._calm_peak, None
        if signals.precursors or (peak is None and self._estimate(signals) is not None):
            return self.check(signals)
        self.growth.calm_row(signals.loss)
        if peak is None:  # no estimate yet: nothing judged
            self.judged = False
            return []
        self._stand(peak)
        self.near = self.growth_near or self._ratio_near()
        return []

    def skipped_steps(self) -> SkippedSteps | None:
        """For the calm lane, after a step the probes measured (or at `reopen`): what the steps
        they skip must show to be quiet for `check` (`_far`), so that the lane tests each with
        one product and a maximum and hands them over in one go (`stand`); and, while log Z is
        far from its bound with its baseline grown, what a step where they measure log Z alone
        must show (`OutputGrowth.logz_floor`). None: the lane asks `calm_at` at each step (a
        streak or an episode open, no baseline yet)."""
        if self.per_norm is not None and (not self.history or self.streaking
                                          or self.episode.active):
            return None
        floor = (None if self.growth_near or self.config.instability_precursor.update_rms
                 else self.growth.logz_floor())
        return SkippedSteps(per_norm=self.per_norm,
                            bound=NEAR * self.config.instability_precursor.abs_min,
                            logz_floor=floor,
                            logz_margin=NEAR * self.config.instability_precursor.logz_rise)

    def stand(self, skipped: SkippedSteps) -> None:
        """The steps the lane took on the plan, as `check` (or `take_calm`) on each: their
        losses kept, log Z where it was measured taken on the quiet path, the ratios last
        judged standing for each (when there is an estimate)."""
        if not skipped.count:
            return
        growth = self.growth
        # every step keeps its loss, as `calm_row` and `check` do, before log Z reads them
        growth.losses.extend(loss for loss in skipped.losses if math.isfinite(loss))
        growth.quiet_logz([logz for logz in skipped.logz if logz is not None])
        if skipped.peak is None:  # no estimate: nothing judged
            self.judged = False
        else:
            self.judged, self.last_max = True, skipped.peak
            self.history.extend([self.history[-1]] * skipped.count)
            self.near = self.growth_near or self._ratio_near()
        skipped.losses, skipped.logz, skipped.count, skipped.peak = [], [], 0, None

    def _far(self, estimate: np.ndarray, signals: StepSignals) -> bool:
        """A skipped step whose estimate is far from every bound (the discounts only lower it),
        with no streak or episode open: the step moves the state as a quiet one, the ratios last
        judged standing for it, at the cost of a product and a maximum."""
        peak = float(np.fmax.reduce(estimate, initial=0.0)) * clip_factor(signals)
        if (peak >= NEAR * self.config.instability_precursor.abs_min or not self.history
                or self.streaking or self.episode.active):
            return False
        self._stand(peak)
        return True

    def _stand(self, peak: float) -> None:
        """A quiet skipped step: the ratios last judged stand for it (its estimate's `peak`)."""
        self.judged, self.last_max = True, peak
        self.history.append(self.history[-1])
        self.episode.update(False)

    def _adapt_hold(self, signals: StepSignals, values: np.ndarray) -> None:
        """A measurement of the ratio: `hold` doubles when the estimate from the one before
        matched every parameter's value (within `HOLD_MATCH`), and is back at `every` when not
        (a second moment that moves: the run's first steps, a changing LR or data)."""
        every = self.config.instability_precursor.every
        estimate = self._estimate(signals)
        self.ratio_measured = signals.step
        if estimate is None or estimate.shape != values.shape:
            self.hold = every
            return
        both = (values > 0) & (estimate > 0) & np.isfinite(values) & np.isfinite(estimate)
        matched = bool(both.any()) and bool(
            (np.abs(np.log(values[both] / estimate[both])) <= HOLD_MATCH).all())
        self.hold = min(self.hold * 2, HOLD_MAX * every) if matched else every

    def _estimate(self, signals: StepSignals) -> np.ndarray | None:
        """A step the probes did not measure: each parameter's ratio as last measured, scaled by
        how its gradient norm (on the host every step) moved since. Adam's second moment is a
        long average (beta2 0.95-0.999) that a few steps hardly move, and the gradient is what
        outgrows it. None without a measurement of the same parameters."""
        now = signals.param_grad_norm
        if self.per_norm is None or now.shape != self.per_norm.shape:
            return None
        return self.per_norm * now

    def _judge(self, signals: StepSignals, values: np.ndarray, logs: np.ndarray) -> list[Event]:
        cfg = self.config
        if self._quiet(values, logs):
            return []
        stacked = np.stack(self.history)
        seen = np.isfinite(stacked).sum(axis=0) >= cfg.instability_precursor.warmup // 2
        known = np.where(seen, stacked, np.nan)
        level = column_medians(known)
        spread = MAD_TO_STD * column_medians(np.abs(known - level))
        # both far above the level and far outside the parameter's own noise (heavy-tailed
        # data makes single parameters' ratios swing with every batch)
        bound = level + np.maximum(math.log(cfg.instability_precursor.ratio),
                                   cfg.instability_precursor.zscore
                                   * np.maximum(spread, cfg.common.min_log_scale))
        high = (seen & np.isfinite(logs) & (logs >= bound)
                & (values >= cfg.instability_precursor.abs_min))
        starts = high & (self.streak == 0)
        # a streak that starts far above the level in one step is a parameter waking up (a dead
        # unit, a rare row seen again: v near 0), not a moment lagging a growing gradient
        self.sudden = np.where(starts,
                               logs - level >= math.log(cfg.instability_precursor.sudden_ratio),
                               self.sudden & high)
        if starts.any():
            self.first = np.where(starts, np.exp(_last_finite(stacked)), self.first)
        self.streak = np.where(high, self.streak + 1, 0)
        self.streaking = bool(high.any())
        self.history.append(np.where(high, bound, logs))
        firing = (self.streak >= cfg.instability_precursor.steps) & ~self.sudden
        if cfg.instability_precursor.trend_window and firing.any():
            # a lasting rise lifts the recent level first; a 2-3 step burst from a flat or low
            # level does not (the history holds the streak's own steps capped at the bound)
            recent = column_medians(known[-cfg.instability_precursor.trend_window:])
            with np.errstate(invalid="ignore"):
                firing &= recent - level >= math.log(cfg.instability_precursor.trend_ratio)
        if firing.any() and self.growth.learning():
            firing[:] = False  # a model still learning, not a lagging moment
        if not self.episode.update(bool(firing.any())):
            return []
        index = int(np.argmax(np.where(firing, logs - level, -np.inf)))
        return [self._event(signals, index, values[index], math.exp(level[index]))]

    def _quiet(self, values: np.ndarray, logs: np.ndarray) -> bool:
        """The usual step, with no ratio up to `detectors.instability_precursor.abs_min`: nothing
        can be high, so the state moves as `_judge` would move it, without its medians (most of its
        cost)."""
        if (values >= self.config.instability_precursor.abs_min).any():
            return False
        self.streak[:] = 0
        self.streaking = False
        self.sudden[:] = False
        self.history.append(logs)
        self.episode.update(False)
        return True

    def _event(self, signals: StepSignals, index: int, value: float, typical: float) -> Event:
        steps = int(self.streak[index])
        first = float(self.first[index])
        rise = trend(value, first)
        name = signals.param_names[index] if index < len(signals.param_names) else str(index)
        ratio = value / typical if typical > 0 else math.inf
        clipped = (f" (of the gradient clipped to {signals.clip_limit:.3g})"
                   if self.clipped < 1.0 else "")
        explained = math.exp(self.discount)
        smaller = (f" once the {explained:.3g}x that its batch explains "
                   f"({self._batch_explains(signals)}) is taken off"
                   if explained >= SAID_DISCOUNT else "")
        return self.event(
            signals.step, "warning",
            f"Adam g/sqrt(v) RMS of {name}{clipped} at {value:.3g}{smaller}, {ratio:.3g}x its "
            f"median {typical:.3g}, above it for {steps} steps, {since(rise, first)}: the gradient "
            f"outgrows Adam's second moment{AHEAD}{EXPECTED_LEAD} steps",
            param=name, value=value, signal=SIGNAL, baseline=typical, ratio=ratio,
            bound=max(self.config.instability_precursor.abs_min,
                      self.config.instability_precursor.ratio * typical),
            steps_above=steps, trend=rise, before=first, expected_lead=EXPECTED_LEAD,
            batch_discount=math.exp(self.discount), clip_factor=self.clipped,
            lr_fall=self.lr_fall)

    def _batch_explains(self, signals: StepSignals) -> str:
        """What about the step's batch explains part of the rise, in words."""
        noise = self.batch_noise
        said = []
        if noise.size_part:
            said.append(f"{signals.batch_elements} elements against a typical "
                        f"{noise.typical:.0f}")
        if noise.loss_part:
            said.append(f"a loss {math.exp(2 * noise.loss_part):.3g}x the typical one")
        return ", ".join(said)

    def state_dict(self) -> dict[str, Any]:
        return {"history": [[None if not math.isfinite(v) else float(v) for v in row]
                            for row in self.history],
                "streak": [int(v) for v in self.streak], "first": [float(v) for v in self.first],
                "sudden": [bool(v) for v in self.sudden],
                "episode": self.episode.state_dict(),
                "attention": self.attention.state_dict(), "growth": self.growth.state_dict(),
                "aftermath": self.aftermath.state_dict(),
                "batch_noise": self.batch_noise.state_dict(),
                "measured": self.measured, "ratio_measured": self.ratio_measured,
                "hold": self.hold, "near": self.near, "last_max": self.last_max,
                "lrs": list(self.lrs), "growth_near": self.growth_near,
                "per_norm": (None if self.per_norm is None else
                             [float(v) if math.isfinite(v) else None for v in self.per_norm])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.clear()
        for row in state.get("history", []):
            self.history.append(np.array([math.nan if v is None else float(v) for v in row]))
        self.streak = np.array(state.get("streak", []), dtype=np.int64)
        self.streaking = bool(self.streak.any())
        self.first = np.array(state.get("first", []), dtype=np.float64)
        self.sudden = np.array(state.get("sudden", [False] * len(self.streak)), dtype=bool)
        if "episode" in state:
            self.episode.load_state_dict(state["episode"])
        self.attention.load_state_dict(state.get("attention", {}))
        self.growth.load_state_dict(state.get("growth", {}))
        self.aftermath.load_state_dict(state.get("aftermath", {}))
        self.batch_noise.load_state_dict(state.get("batch_noise", {}))
        measured = state.get("measured")
        self.measured = None if measured is None else int(measured)
        ratio_measured = state.get("ratio_measured", measured)
        self.ratio_measured = None if ratio_measured is None else int(ratio_measured)
        self.hold = int(state.get("hold", self.config.instability_precursor.every))
        self.near = bool(state.get("near", False))
        self.last_max = float(state.get("last_max", 0.0))
        self.lrs.clear()
        self.lrs.extend(float(v) for v in state.get("lrs", []))
        per_norm = state.get("per_norm")
        self.per_norm = (None if per_norm is None else
                         np.array([math.nan if v is None else v for v in per_norm]))
        self.growth_near = bool(state.get("growth_near", False))

