"""`grad_explosion`: the pre-clip global gradient norm is far above normal.

Two rules. The guide's absolute rule of thumb (norm > `detectors.grad_explosion.abs_threshold`,
1000) applies before the baseline is warm, and afterwards when the norm is also
`detectors.grad_explosion.abs_min_ratio` times the run's typical norm and outside its noise
(`detectors.grad_explosion.zscore`). The adaptive rule compares the norm with a robust baseline of
this run (median and MAD of recent log-norms), so a model whose normal norm is 50 and one whose
normal norm is 0.5 are judged on their own scale. Below the absolute limit, a run that has shown
one-step jumps that were back to normal at the next step (heavy-tailed data) must jump
`detectors.common.transient_margin` beyond the largest of them to count.

A gradient that blew up (above the absolute limit, or `detectors.grad_explosion.error_ratio` times
the typical norm) is an error at once. A smaller jump is first an outlier batch (`info`, naming the
step), which the Guard acts on at once all the same (the adaptive clip's alarm, the recover policy's
skip and watch); it is told again as a warning only if the norm is still
`detectors.grad_explosion.ratio` times the typical one (or non-finite) at the next step, or on two
of the three steps after the jump (`detect.base.Outlier`): a one-batch jump that came back did no
lasting harm (`loss_spike` tells the same of the loss).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from trainguard.detect.base import Episode, Outlier, OutlierDetector, as_outlier
from trainguard.detect.calm import SignalColumns, first_true, pass_calm_jumps, window_medians
from trainguard.detect.settings import DetectorConfig
from trainguard.events import Event, Severity
from trainguard.signals import RobustBaseline, StepSignals, TransientJumps, safe_log


class GradExplosion(OutlierDetector):
    kind = "grad_explosion"
    budget_us = 20.0  # its robust baseline (median and spread of a window) moves every step
    reads = frozenset({"amp_overflow", "grad_norm", "param_grad_norm", "param_names"})

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.baseline = RobustBaseline(config.common.baseline_window, config.common.min_log_scale)
        self.transients = TransientJumps(config.common.transient_horizon,
                                         math.log(config.common.transient_margin))
        self.episode = Episode(config.common.rearm_steps)
        self.outlier: Outlier | None = None
        """The last jump, told as an outlier batch, while the norms after it have not yet said
        whether it did harm."""

    def check(self, signals: StepSignals) -> list[Event]:
        cfg = self.config
        norm = signals.grad_norm
        if signals.amp_overflow:  # the scaler's calibration says nothing of the jump
            return []
        log_norm = safe_log(norm)
        if not math.isfinite(log_norm):  # up, when it went on to NaN or inf; 0 is back
            return self._judge_outlier(signals, up=not math.isfinite(norm))
        warm = len(self.baseline) >= max(cfg.common.warmup_steps, 1)
        median, scale = self.baseline.stats() if warm else (math.nan, math.nan)
        typical = math.exp(median) if warm else math.nan
        excess = log_norm - median if warm else math.nan
        events = self._judge_outlier(signals, up=excess >= math.log(cfg.grad_explosion.ratio))
        noise_ok = warm and excess >= cfg.grad_explosion.zscore * scale
        adaptive = noise_ok and excess >= math.log(cfg.grad_explosion.ratio)
        absolute = norm > cfg.grad_explosion.abs_threshold and (
            not warm or (noise_ok and excess >= math.log(cfg.grad_explosion.abs_min_ratio)))
        jump = adaptive or absolute
        # a norm above the guide's absolute limit is never routine, whatever the history
        anomalous = jump and (norm > cfg.grad_explosion.abs_threshold
                              or excess >= self.transients.threshold(signals.step))
        self.transients.observe(signals.step, excess, jumped=jump and warm,
                                normal=warm and excess < math.log(cfg.grad_explosion.ratio))
        # before warm-up there is no baseline to protect: admit the raw value
        self.baseline.admit(min(log_norm, median + math.log(cfg.grad_explosion.ratio))
                            if jump and warm else log_norm)
        if not self.episode.update(anomalous):
            return events
        ratio = norm / typical if warm else math.nan
        severity: Severity
        if absolute:
            severity = "error"
            message = (f"gradient norm {norm:.4g} is above the absolute limit "
                       f"{cfg.grad_explosion.abs_threshold:g}")
        else:
            severity = "error" if ratio >= cfg.grad_explosion.error_ratio else "info"
            message = f"gradient norm {norm:.4g}"
        if warm:
            message += f" ({ratio:.1f}x this run's typical {typical:.3g})"
        worst = self._largest(signals)
        param = None if worst is None else signals.param_names[worst]
        if worst is not None:
            message += f"; largest in {param} ({signals.param_grad_norm[worst]:.3g})"
        details: dict[str, Any] = {}
        if severity == "info":  # blown up it is not: what the next step shows decides
            self.outlier = Outlier(signals.step, norm, typical, ratio)
            message = as_outlier(message, signals.step,
                                 f"a norm still {cfg.grad_explosion.ratio:g}x the typical one")
            details["outlier"] = True
        return [*events, self.event(signals.step, severity, message, param=param, value=norm,
                                    baseline=typical if warm else None,
                                    ratio=ratio if warm else None, **details)]

    def calm_bounds(self) -> tuple[float, float] | None:
        """A norm under sqrt(`grad_explosion.ratio`) times its median and under the absolute
        limit, once the baseline is warm and no outlier, episode or open jump waits."""
        cfg = self.config
        if (self.outlier is not None or self.episode.active or self.transients.open_jump
                or len(self.baseline) < max(cfg.common.warmup_steps, 1)):
            return None
        median = self.baseline.median()
        return (math.inf, min(cfg.grad_explosion.abs_threshold,
                              math.exp(median + 0.5 * math.log(cfg.grad_explosion.ratio))))

    def skip_calm(self, columns: SignalColumns, start: int, end: int) -> int:
        """Calm rows: a skipped step (`amp_overflow`), a norm that is 0 or not finite (nothing to
        judge while no outlier waits), or one within the absolute limit and under the jump ratio
        over the median of the last `baseline_window` norms (which the baseline admits as they
        are). Taken once the baseline is full and warm and no outlier, episode or open jump is
        pending."""
        cfg = self.config
        baseline = self.baseline
        if (self.outlier is not None or self.episode.active or self.transients.open_jump
                or len(baseline) < max(baseline.window, cfg.common.warmup_steps, 1)):
            return start
        end = columns.chunk(start, end, baseline.window)
        logs = columns.log_grad_norm()[start:end]
        judged = np.isfinite(logs) & ~columns.amp_overflow[start:end]
        values = logs[judged]
        history = np.fromiter(baseline.values, dtype=np.float64, count=len(baseline))
        median = window_medians(history, values, baseline.window, including=False)
        stop = first_true((values - median >= math.log(cfg.grad_explosion.ratio))
                          | (columns.grad_norm[start:end][judged]
                             > cfg.grad_explosion.abs_threshold))
        return pass_calm_jumps(baseline, self.transients, values, judged, stop, start, end)

    def _stayed(self, outlier: Outlier, signals: StepSignals) -> Event:
        now = signals.grad_norm
        worst = self._largest(signals)
        param = None if worst is None else signals.param_names[worst]
        return self.event(
            signals.step, "warning",
            f"gradient norm {outlier.value:.4g} at step {outlier.step} ({outlier.ratio:.1f}x this "
            f"run's typical {outlier.typical:.3g}) has not come back: {now:.4g} at step "
            f"{signals.step}" + (f"; largest in {param}" if param is not None else ""),
            param=param, value=outlier.value, baseline=outlier.typical, ratio=outlier.ratio,
            jump_step=outlier.step, norm_now=now)

    @staticmethod
    def _largest(signals: StepSignals) -> int | None:
        """The index of the parameter with the largest gradient norm (the first non-finite one,
        if any)."""
        return int(signals.param_grad_norm.argmax()) if len(signals.param_grad_norm) else None

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline.state_dict(), "episode": self.episode.state_dict(),
                "transients": self.transients.state_dict(),
                "outlier": None if self.outlier is None else self.outlier.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baseline.load_state_dict(state["baseline"])
        self.episode.load_state_dict(state["episode"])
        self.transients.load_state_dict(state.get("transients", {}))
        outlier = state.get("outlier")
        self.outlier = None if outlier is None else Outlier.from_state(outlier)
