"""`loss_spike`: a sudden jump of the loss against a robust recent baseline.

Catches the guide's "rocket launch" (2.3 -> 1e8) and smaller jumps (3x) that stand far outside the
run's own noise. The baseline level is the median of the last `detectors.loss_spike.level_window`
losses (short, so it follows a falling curve); the noise scale is the MAD over `baseline_window`
steps. Works in log space on positive losses. Before the baseline is warm (the first `warmup_steps`
steps) a jump must reach `detectors.loss_spike.early_ratio` against the few values seen so far, so
that a learning rate that blows the run up at its very first steps is caught. A run whose data has
heavy tails shows one-step jumps that are back to normal at the next step; once it has, a new jump
must go `detectors.common.transient_margin` beyond the largest such jump of the last
`detectors.common.transient_horizon` steps. A jump within float noise at the scale the loss started
at (`detectors.common.loss_resolution` of it) is none, however large its ratio near zero. A spike
records the most a cross-entropy of the model's own class scores could cost at its step
(`details["ce_ceiling"]`, when `probes/logz.py` measured it), and says when the loss stands beyond
it (`diagnose/loss_bound.py`): the cause ranking reads it.

A jump is known at once; the harm it did is not. One batch can lift the loss by orders of
magnitude (a heavy-tailed target, a mislabelled sample) and leave the run as it was. So a jump is
first told as what it is known to be, an outlier batch (`info`, naming the step), which the Guard
still acts on at once (the adaptive clip's alarm, the recover policy's skip and watch: the kind's
tags and reaction, whatever the severity). The losses after it say whether it did harm: a loss
still `detectors.loss_spike.ratio` times the level (or non-finite) at the next step, or on two of
the three steps after the jump, has not come back (`detect.base.Outlier`), and the jump is told
again at that step as a warning, or an error from `detectors.loss_spike.error_ratio`; a loss back at
its level leaves the outlier at `info`. A loss beyond what the model's class scores allow is no
batch's cross-entropy, however far out the batch: that jump is told at once at its size.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from trainguard.detect.base import Episode, Outlier, OutlierDetector, as_outlier
from trainguard.detect.calm import SignalColumns, first_true, pass_calm_jumps, window_medians
from trainguard.detect.settings import DetectorConfig
from trainguard.diagnose.loss_bound import CEILING_KEY, beyond, ceiling_of, describe
from trainguard.events import Event, Severity
from trainguard.signals import LossOrigin, RobustBaseline, StepSignals, TransientJumps, safe_log


class LossSpike(OutlierDetector):
    kind = "loss_spike"
    budget_us = 20.0  # its robust baseline (median and spread of a window) moves every step
    reads = frozenset({"loss", "precursors"})

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.baseline = RobustBaseline(config.common.baseline_window, config.common.min_log_scale)
        self.transients = TransientJumps(config.common.transient_horizon,
                                         math.log(config.common.transient_margin))
        self.episode = Episode(config.common.rearm_steps)
        self.origin = LossOrigin(config.common.warmup_steps, config.common.loss_resolution)
        self.outlier: Outlier | None = None
        """The last jump, told as an outlier batch, while the losses after it have not yet said
        whether it did harm."""

    def check(self, signals: StepSignals) -> list[Event]:
        cfg = self.config
        if signals.loss is None:
            return []
        if not math.isfinite(signals.loss):  # a jump that went on to NaN or inf did harm
            return self._judge_outlier(signals, up=True)
        log_loss = safe_log(signals.loss)
        if not math.isfinite(log_loss):  # 0 or below: back, whatever it jumped from
            self._judge_outlier(signals, up=False)
            return []
        self.origin.observe(signals.loss)
        n = len(self.baseline)
        if n == 0:
            self.baseline.admit(log_loss)
            return []
        _, scale = self.baseline.stats()
        level = self.baseline.recent_median(cfg.loss_spike.level_window)
        excess = log_loss - level
        warm = n >= cfg.common.warmup_steps
        threshold = math.log(cfg.loss_spike.ratio if warm else cfg.loss_spike.early_ratio)
        events = self._judge_outlier(signals, up=excess >= threshold)
        jump = (excess >= threshold and excess >= cfg.loss_spike.zscore * scale
                and not self.origin.negligible(signals.loss - math.exp(level)))
        spike = jump and excess >= self.transients.threshold(signals.step)
        self.transients.observe(signals.step, excess, jumped=jump, normal=excess < threshold)
        self.baseline.admit(min(log_loss, level + threshold) if jump else log_loss)
        if not self.episode.update(spike):
            return events
        ceiling = ceiling_of(signals.precursors)
        if ceiling is not None and beyond(signals.loss, ceiling):
            return [*events, self._beyond_scores(signals, level, excess, ceiling)]
        outlier = Outlier(signals.step, signals.loss, math.exp(level), math.exp(excess),
                          details={} if ceiling is None else {CEILING_KEY: ceiling})
        self.outlier = outlier
        event = self.event(
            signals.step, "info", as_outlier(
                f"loss jumped to {signals.loss:.4g}, {outlier.ratio:.3g}x its recent median "
                f"{outlier.typical:.4g}{_beyond(signals.loss, outlier.details)}", signals.step,
                "a loss that has not come back"),
            value=signals.loss, baseline=outlier.typical, ratio=outlier.ratio, outlier=True)
        event.details.update(outlier.details)
        return [*events, event]

    def calm_bounds(self) -> tuple[float, float] | None:
        """A loss under sqrt(`loss_spike.ratio`) times its recent median, once the baseline is
        warm and no outlier, episode or open jump waits: halfway, on a log scale, to a jump."""
        cfg = self.config
        if (self.outlier is not None or self.episode.active or self.transients.open_jump
                or len(self.baseline) < max(cfg.common.warmup_steps, 1)):
            return None
        level = self.baseline.recent_median(cfg.loss_spike.level_window)
        return (math.exp(level + 0.5 * math.log(cfg.loss_spike.ratio)), math.inf)

    def skip_calm(self, columns: SignalColumns, start: int, end: int) -> int:
        """Calm rows: no loss, or one that is not finite or not positive (nothing to judge while
        no outlier waits), or a loss under the spike threshold over the median of the last
        `level_window` losses (which the baseline admits as they are). Taken once the baseline is
        full and warm and no outlier, episode or open jump is pending."""
        cfg = self.config
        baseline = self.baseline
        if (self.outlier is not None or self.episode.active or self.transients.open_jump
                or len(baseline) < max(baseline.window, cfg.common.warmup_steps, 1)
                or not self.origin.full):
            return start
        end = columns.chunk(start, end, baseline.window)
        logs = columns.log_loss()[start:end]
        judged = np.isfinite(logs)  # finite positive losses; every other row is calm here
        values = logs[judged]
        count = min(cfg.loss_spike.level_window, baseline.window)
        history = np.fromiter(baseline.values, dtype=np.float64, count=len(baseline))
        level = window_medians(history, values, count, including=False)
        stop = first_true(values - level >= math.log(cfg.loss_spike.ratio))
        return pass_calm_jumps(baseline, self.transients, values, judged, stop, start, end)

    def _beyond_scores(self, signals: StepSignals, level: float, excess: float,
                       ceiling: float) -> Event:
        """A jump beyond what the model's class scores allow, told at once at its size: no
        batch of data costs a cross-entropy there, so it is no outlier batch."""
        assert signals.loss is not None
        ratio, typical = math.exp(excess), math.exp(level)
        severity: Severity = "error" if ratio >= self.config.loss_spike.error_ratio else "warning"
        event = self.event(
            signals.step, severity,
            f"loss jumped to {signals.loss:.4g}, {ratio:.3g}x its recent median {typical:.4g}"
            f"{_beyond(signals.loss, {CEILING_KEY: ceiling})}", value=signals.loss,
            baseline=typical, ratio=ratio)
        event.details[CEILING_KEY] = ceiling
        return event

    def _stayed(self, outlier: Outlier, signals: StepSignals) -> Event:
        assert signals.loss is not None
        cfg = self.config
        severity: Severity = "error" if outlier.ratio >= cfg.loss_spike.error_ratio else "warning"
        details, said = dict(outlier.details), _beyond(outlier.value, outlier.details)
        ceiling = ceiling_of(signals.precursors)
        if CEILING_KEY not in details and ceiling is not None and beyond(signals.loss, ceiling):
            # the jump's step was not measured (the precursor probes' cadence): this step's
            # scores say the loss still stands beyond what they allow
            details[CEILING_KEY] = ceiling
            said = f"; at step {signals.step} {describe(signals.loss, ceiling)}"
        event = self.event(
            signals.step, severity,
            f"loss jumped to {outlier.value:.4g} at step {outlier.step}, {outlier.ratio:.3g}x its "
            f"recent median {outlier.typical:.4g}{said}, and "
            f"has not come back: {signals.loss:.4g} at step {signals.step}",
            value=outlier.value, baseline=outlier.typical, ratio=outlier.ratio,
            jump_step=outlier.step, loss_now=signals.loss)
        event.details.update(details)
        return event

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline.state_dict(), "episode": self.episode.state_dict(),
                "transients": self.transients.state_dict(), "origin": self.origin.state_dict(),
                "outlier": None if self.outlier is None else self.outlier.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baseline.load_state_dict(state["baseline"])
        self.episode.load_state_dict(state["episode"])
        self.transients.load_state_dict(state.get("transients", {}))
        self.origin.load_state_dict(state.get("origin", {}))
        outlier = state.get("outlier")
        self.outlier = None if outlier is None else Outlier.from_state(outlier)


def _beyond(loss: float, details: dict[str, float]) -> str:
    """The loss's stand against the most the model's class scores allow, in words, when it is
    beyond it."""
    ceiling = details.get(CEILING_KEY)
    return f"; {describe(loss, ceiling)}" if ceiling is not None and beyond(loss, ceiling) else ""
