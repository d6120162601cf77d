"""`loss_spike`: a sudden jump of the loss against a robust recent baseline.

Catches the guide's "rocket launch" (2.3 -> 1e8) and smaller jumps (3x) that stand far outside the
run's own noise. The baseline level is the median of the last `loss_spike_level_window` losses
(short, so it follows a falling curve); the noise scale is the MAD over `baseline_window` steps.
Works in log space on positive losses. Before the baseline is warm (the first `warmup_steps`
steps) a jump must reach `loss_spike_early_ratio` against the few values seen so far, so that a
learning rate that blows the run up at its very first steps is caught. A run whose data has heavy
tails shows one-step jumps that are back to normal at the next step; once it has, a new jump must
go `transient_margin` beyond the largest such jump of the last `transient_horizon` steps. A jump
within float noise at the scale the loss started at (`loss_resolution` of it) is none, however
large its ratio near zero. A spike records the most a cross-entropy of the model's own class
scores could cost at its step (`details["ce_ceiling"]`, when `probes/logz.py` measured it), and
says when the loss stands beyond it (`diagnose/loss_bound.py`): the cause ranking reads it.
"""

from __future__ import annotations

import math
from typing import Any

from trainguard.config import DetectorConfig
from trainguard.detect.base import Detector, Episode
from trainguard.diagnose.loss_bound import CEILING_KEY, beyond, ceiling_of, describe
from trainguard.events import Event, Severity
from trainguard.signals import LossOrigin, RobustBaseline, StepSignals, TransientJumps, safe_log


class LossSpike(Detector):
    kind = "loss_spike"
    reads = frozenset({"loss", "precursors"})

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.baseline = RobustBaseline(config.baseline_window, config.min_log_scale)
        self.transients = TransientJumps(config.transient_horizon,
                                         math.log(config.transient_margin))
        self.episode = Episode(config.rearm_steps)
        self.origin = LossOrigin(config.warmup_steps, config.loss_resolution)

    def check(self, signals: StepSignals) -> list[Event]:
        cfg = self.config
        if signals.loss is None:
            return []
        log_loss = safe_log(signals.loss)
        if not math.isfinite(log_loss):
            return []
        self.origin.observe(signals.loss)
        n = len(self.baseline)
        if n == 0:
            self.baseline.admit(log_loss)
            return []
        _, scale = self.baseline.stats()
        level = self.baseline.recent_median(cfg.loss_spike_level_window)
        excess = log_loss - level
        warm = n >= cfg.warmup_steps
        threshold = math.log(cfg.loss_spike_ratio if warm else cfg.loss_spike_early_ratio)
        jump = (excess >= threshold and excess >= cfg.loss_spike_zscore * scale
                and not self.origin.negligible(signals.loss - math.exp(level)))
        spike = jump and excess >= self.transients.threshold(signals.step)
        self.transients.observe(signals.step, excess, jumped=jump, normal=excess < threshold)
        self.baseline.admit(min(log_loss, level + threshold) if jump else log_loss)
        if not self.episode.update(spike):
            return []
        ratio = math.exp(excess)
        typical = math.exp(level)
        severity: Severity = "error" if ratio >= cfg.loss_spike_error_ratio else "warning"
        ceiling = ceiling_of(signals.precursors)
        said = (f"; {describe(signals.loss, ceiling)}" if ceiling is not None
                and beyond(signals.loss, ceiling) else "")
        event = self.event(signals.step, severity,
                           f"loss jumped to {signals.loss:.4g}, {ratio:.3g}x its recent median "
                           f"{typical:.4g}{said}", value=signals.loss, baseline=typical,
                           ratio=ratio)
        if ceiling is not None:
            event.details[CEILING_KEY] = ceiling
        return [event]

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline.state_dict(), "episode": self.episode.state_dict(),
                "transients": self.transients.state_dict(), "origin": self.origin.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baseline.load_state_dict(state["baseline"])
        self.episode.load_state_dict(state["episode"])
        self.transients.load_state_dict(state.get("transients", {}))
        self.origin.load_state_dict(state.get("origin", {}))
