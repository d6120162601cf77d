"""`chosen_likelihood_falling`: the chosen completions' log-probability fell far below its start
while the margins grew (likelihood displacement).

DPO raises the margin between chosen and rejected; it can do so by pushing both down, the
rejected faster. The policy then learns the preference yet makes the chosen answers less likely
than it did at the start: `logps/chosen` falling far below its starting level (the median of
its first `detectors.chosen_likelihood_falling.warmup` values), by more than `share` of it,
while the margin is positive. A policy that learns keeps or raises it. Reported once per episode.
"""

from __future__ import annotations

import math

from trainguard.detect.base import FromStartLevel
from trainguard.detect.trainer_metrics import CHOSEN_LOGPS, MARGINS
from trainguard.events import Event
from trainguard.signals import StepSignals


class ChosenLikelihoodFalling(FromStartLevel):
    kind = "chosen_likelihood_falling"
    reads = frozenset({"trainer_metrics"})
    idle_without = frozenset({"trainer_metrics"})

    def check(self, signals: StepSignals) -> list[Event]:
        metrics = signals.trainer_metrics
        value = metrics.get(CHOSEN_LOGPS)
        if value is None or not math.isfinite(value):
            return []  # a NaN log-probability is `nonfinite_metric`'s
        settings = self.config.chosen_likelihood_falling
        start = self.start_level(value, settings.warmup)
        if start is None:
            return []
        margin = metrics.get(MARGINS)
        separating = margin is not None and math.isfinite(margin) and margin > 0
        # log-probabilities are <= 0: "far below" is a share of the start's own magnitude
        fallen = start < 0 and value < start * (1 + settings.share)
        if not self.episode.update(fallen and separating):
            return []
        return [self.event(
            signals.step, "warning",
            f"the chosen completions' log-probability fell to {value:.4g} from the {start:.4g} it "
            f"started at, while the reward margin is {margin:.3g}: the policy separates the "
            "pairs by making the rejected ones unlikely and the chosen ones less likely too "
            "(likelihood displacement)",
            param=CHOSEN_LOGPS, value=value, start=start, margin=margin)]
