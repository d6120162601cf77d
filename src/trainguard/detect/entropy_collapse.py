"""`entropy_collapse`: the policy's entropy fell to a small share of where the run started.

A trainer that samples its own completions (GRPO, RLOO) logs the entropy of the policy's token
distribution. Learning lowers it; a policy that becomes deterministic within a run (under a
tenth of its starting level, the median of its first `detectors.entropy_collapse.warmup`
values) no longer explores: every completion of a prompt alike, every reward alike, no
learning signal left. It comes from updates too large for the policy (the LR) or a KL penalty
too weak to hold it near its reference. Reported once per episode.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from trainguard.detect.base import Detector, Episode
from trainguard.detect.trainer_metrics import ENTROPY
from trainguard.events import Event
from trainguard.signals import StepSignals


class EntropyCollapse(Detector):
    kind = "entropy_collapse"
    reads = frozenset({"trainer_metrics"})

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.first: list[float] = []
        """The first finite entropies: the level the run started at."""
        self.episode = Episode(config.common.rearm_steps)

    def check(self, signals: StepSignals) -> list[Event]:
        value = signals.trainer_metrics.get(ENTROPY)
        if value is None or not math.isfinite(value):
            return []  # a NaN entropy is `nonfinite_metric`'s
        settings = self.config.entropy_collapse
        if len(self.first) < settings.warmup:
            self.first.append(value)
            return []
        start = statistics.median(self.first)
        collapsed = start > 0 and value < settings.share * start
        if not self.episode.update(collapsed):
            return []
        return [self.event(
            signals.step, "warning",
            f"the policy's entropy fell to {value:.3g}, {value / start:.1%} of the {start:.3g} "
            "it started at: the policy is becoming deterministic and stops exploring",
            param=ENTROPY, value=value, start=start)]

    def state_dict(self) -> dict[str, Any]:
        return {"first": list(self.first), "episode": self.episode.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.first = [float(v) for v in state.get("first", [])]
        if "episode" in state:
            self.episode.load_state_dict(state["episode"])
