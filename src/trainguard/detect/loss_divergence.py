"""`loss_divergence`: a sustained upward trend of the loss.

The loss is smoothed in log space by a bias-corrected exponential moving average (span
`divergence_span`; until it has seen many steps it is close to the plain mean of the losses so
far, so one unlucky first batch does not set the reference). The run diverges when the smoothed
loss stays `divergence_ratio` times above its best level for `divergence_patience` consecutive
steps after `warmup_steps`; the best level is the lowest smoothed value since, or the median of
the warm-up's losses if lower (a run that blows up in its first steps and stays up diverges
too). Each loss enters the average capped at twice that ratio above it, so a single huge spike
does not qualify on its own.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from trainguard.config import DetectorConfig
from trainguard.detect.base import Detector, Episode
from trainguard.events import Event
from trainguard.signals import StepSignals, safe_log


class LossDivergence(Detector):
    kind = "loss_divergence"

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.raw = 0.0
        """Exponential moving sum without bias correction (starts at 0, like Adam's moments)."""
        self.seen = 0
        self.best = math.inf
        self.above = 0
        self.start: list[float] = []
        """Log losses of the warm-up steps (their median is where the run started)."""
        self.episode = Episode(config.rearm_steps)

    def smoothed(self) -> float:
        decay = 1.0 - 2.0 / (self.config.divergence_span + 1)
        return self.raw / (1.0 - decay ** self.seen)

    def check(self, signals: StepSignals) -> list[Event]:
        cfg = self.config
        if signals.loss is None:
            return []
        log_loss = safe_log(signals.loss)
        if not math.isfinite(log_loss):
            return []
        margin = math.log(cfg.divergence_ratio)
        if self.seen:
            log_loss = min(log_loss, self.smoothed() + 2 * margin)
        decay = 1.0 - 2.0 / (cfg.divergence_span + 1)
        self.raw = decay * self.raw + (1 - decay) * log_loss
        self.seen += 1
        ema = self.smoothed()
        if self.seen <= cfg.warmup_steps:
            self.start.append(log_loss)
            return []
        if len(self.start) == cfg.warmup_steps:  # the warm-up's median: where the run started
            self.best = min(self.best, statistics.median(self.start))
            self.start.append(math.inf)  # counted once
        self.best = min(self.best, ema)
        rise = ema - self.best
        self.above = self.above + 1 if rise >= margin else 0
        if not self.episode.update(self.above >= cfg.divergence_patience):
            return []
        return [self.event(signals.step, "error",
                           f"smoothed loss {math.exp(ema):.4g} has stayed above "
                           f"{cfg.divergence_ratio:g}x its best {math.exp(self.best):.4g} for "
                           f"{self.above} steps", value=math.exp(ema), ratio=math.exp(rise),
                           best=math.exp(self.best))]

    def state_dict(self) -> dict[str, Any]:
        return {"raw": self.raw, "seen": self.seen, "best": self.best, "above": self.above,
                "start": list(self.start), "episode": self.episode.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.raw = float(state["raw"])
        self.seen = int(state["seen"])
        self.best = float(state["best"])
        self.above = int(state["above"])
        self.start = [float(v) for v in state.get("start", [])]
        self.episode.load_state_dict(state["episode"])
