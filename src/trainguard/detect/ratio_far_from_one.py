"""`ratio_far_from_one`: the policy's probability ratio to the policy that sampled its data is far
from 1.

PPO, and GRPO trained on completions from another engine or over several optimisation passes,
weigh each token by exp(logp_now - logp_then): its probability under the policy being trained
over its probability under the one that sampled it. Older TRL PPO logs the batch's mean as
`val/ratio`, GRPO with a separate generation engine as `sampling/importance_sampling_ratio/mean`.
Its expected value is 1 by construction whatever the trainer, so the band is absolute: a mean
above `detectors.ratio_far_from_one.limit` (2) or under its inverse for `steps` logged steps in
a row says the policy moved far between sampling and training, outside any trust region its
clipping keeps (PPO's is 1 +- 0.2): updates too large for it. TRL's PPO refused such batches
("ratio 12.26 exceeds threshold 10, skipping batch"). A NaN ratio is `nonfinite_metric`'s.
Reported once per episode.
"""

from __future__ import annotations

import math

from trainguard.detect.base import StreakDetector
from trainguard.detect.trainer_metrics import RATIO, first
from trainguard.events import Event
from trainguard.signals import StepSignals


class RatioFarFromOne(StreakDetector):
    kind = "ratio_far_from_one"
    reads = frozenset({"trainer_metrics"})
    idle_without = frozenset({"trainer_metrics"})

    @property
    def needed(self) -> int:
        return self.config.ratio_far_from_one.steps

    def check(self, signals: StepSignals) -> list[Event]:
        found = first(signals.trainer_metrics, RATIO)
        if found is None:
            return []
        name, value = found
        if not math.isfinite(value) or value <= 0:
            return []
        far = abs(math.log(value)) > math.log(self.config.ratio_far_from_one.limit)
        if not self.count(far):
            return []
        side = "above" if value > 1 else "below"
        return [self.event(
            signals.step, "warning",
            f"the policy's probability ratio to the policy that sampled its data ({name}) is "
            f"{value:.3g}, far {side} 1 ({self.streak} logged step(s) in a row): the policy "
            "moved far between sampling and training, outside the trust region its clipping "
            "keeps (updates too large for it)", param=name, value=value, metric=name)]
