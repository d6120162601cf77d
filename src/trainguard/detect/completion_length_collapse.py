"""`completion_length_collapse`: the completions shrank to a small share of their starting length.

A trainer that samples its own completions (GRPO, RLOO) logs their mean length
(`completions/mean_length`). A policy whose answers shrink under `share` of where the run
started (the median of its first `detectors.completion_length_collapse.warmup` values) for
`steps` logged steps in a row has collapsed to short or empty answers: one token, an end of
sequence straight away, whatever some reward still pays for. Updates too large for the policy, or
a KL penalty too weak to hold it near its reference, let it drift there. Reported once per
episode.
"""

from __future__ import annotations

import math

from trainguard.detect.base import FromStartLevel
from trainguard.detect.trainer_metrics import MEAN_LENGTH
from trainguard.events import Event
from trainguard.signals import StepSignals


class CompletionLengthCollapse(FromStartLevel):
    kind = "completion_length_collapse"
    reads = frozenset({"trainer_metrics"})
    idle_without = frozenset({"trainer_metrics"})

    def check(self, signals: StepSignals) -> list[Event]:
        value = signals.trainer_metrics.get(MEAN_LENGTH)
        if value is None or not math.isfinite(value):
            return []
        settings = self.config.completion_length_collapse
        start = self.start_level(value, settings.warmup)
        if start is None:
            return []
        if not self.held(start > 0 and value < settings.share * start, settings.steps):
            return []
        return [self.event(
            signals.step, "warning",
            f"the completions' mean length fell to {value:.3g} tokens, {value / start:.0%} of "
            f"the {start:.3g} the run started at ({self.streak} logged step(s) in a row): the "
            "policy collapsed to short or empty answers",
            param=MEAN_LENGTH, value=value, start=start)]
