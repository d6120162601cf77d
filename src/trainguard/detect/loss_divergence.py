"""`loss_divergence`: a sustained upward trend of the loss.

The loss is smoothed with an exponential moving average in log space (span `divergence_span`);
the run diverges when the smoothed loss stays `divergence_ratio` times above the best smoothed
value seen for `divergence_patience` consecutive steps. Noise and single spikes do not qualify.
"""

from __future__ import annotations

import math
from typing import Any

from trainguard.config import DetectorConfig
from trainguard.detect.base import Detector
from trainguard.events import Event
from trainguard.signals import StepSignals, safe_log


class LossDivergence(Detector):
    kind = "loss_divergence"

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.ema: float | None = None
        self.best = math.inf
        self.seen = 0
        self.above = 0
        self.active = False

    def check(self, signals: StepSignals) -> list[Event]:
        cfg = self.config
        if signals.loss is None:
            return []
        log_loss = safe_log(signals.loss)
        if not math.isfinite(log_loss):
            return []
        alpha = 2.0 / (cfg.divergence_span + 1)
        self.ema = log_loss if self.ema is None else self.ema + alpha * (log_loss - self.ema)
        self.seen += 1
        self.best = min(self.best, self.ema)
        if self.seen <= cfg.warmup_steps:
            return []
        rise = self.ema - self.best
        if rise < math.log(cfg.divergence_ratio):
            self.above = 0
            self.active = False
            return []
        self.above += 1
        if self.above < cfg.divergence_patience or self.active:
            return []
        self.active = True
        ratio = math.exp(rise)
        return [self.event(signals.step, "error",
                           f"smoothed loss {math.exp(self.ema):.4g} has stayed above "
                           f"{cfg.divergence_ratio:g}x its best {math.exp(self.best):.4g} for "
                           f"{self.above} steps", value=math.exp(self.ema), ratio=ratio,
                           best=math.exp(self.best))]

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema, "best": self.best, "seen": self.seen, "above": self.above,
                "active": self.active}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema = state["ema"]
        self.best = float(state["best"])
        self.seen = int(state["seen"])
        self.above = int(state["above"])
        self.active = bool(state["active"])
