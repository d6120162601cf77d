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

from trainguard.detect.base import FromStartLevel
from trainguard.detect.trainer_metrics import ENTROPY
from trainguard.events import Event
from trainguard.signals import StepSignals


class EntropyCollapse(FromStartLevel):
    kind = "entropy_collapse"
    reads = frozenset({"trainer_metrics"})
    idle_without = frozenset({"trainer_metrics"})

    def check(self, signals: StepSignals) -> list[Event]:
        value = signals.trainer_metrics.get(ENTROPY)
        if value is None or not math.isfinite(value):
            return []  # a NaN entropy is `nonfinite_metric`'s
        settings = self.config.entropy_collapse
        start = self.start_level(value, settings.warmup)
        if start is None:
            return []
        collapsed = start > 0 and value < settings.share * start
        if not self.episode.update(collapsed):
            return []
        return [self.event(
            signals.step, "warning",
            f"the policy's entropy fell to {value:.3g}, {value / start:.1%} of the {start:.3g} "
            "it started at: the policy is becoming deterministic and stops exploring",
            param=ENTROPY, value=value, start=start)]
