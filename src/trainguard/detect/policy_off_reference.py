"""`policy_off_reference`: the policy's first step already differs from its reference model.

Before its first update a policy made from its reference computes the same log-probabilities:
the first implicit rewards of a preference run (DPO, KTO) and the first KL of a GRPO or RLOO run
are exactly 0. Values clearly away from 0 there (over `detectors.policy_off_reference.tolerance`)
say the policy's forward is not the reference's: dropout left on in the policy (the reference
runs in eval mode; TRL's `disable_dropout=True` turns it off), or a reference that is not the
policy's starting point. Judged once, on the first step with such metrics.
"""

from __future__ import annotations

import math
from typing import Any

from trainguard.detect.base import Detector
from trainguard.detect.trainer_metrics import CHOSEN_REWARD, KL, REJECTED_REWARD
from trainguard.events import Event
from trainguard.signals import StepSignals

AT_START = (CHOSEN_REWARD, REJECTED_REWARD, *KL)
"""The metrics that are 0 at the first step of a policy made from its reference."""


class PolicyOffReference(Detector):
    kind = "policy_off_reference"
    reads = frozenset({"trainer_metrics"})
    idle_without = frozenset({"trainer_metrics"})
    # a log's first row is written after updates (and averaged over a logging window): the
    # step before any update is seen live only
    live_only = True

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.judged = False

    def check(self, signals: StepSignals) -> list[Event]:
        if self.judged:
            return []
        metrics = signals.trainer_metrics
        first = {name: metrics[name] for name in AT_START if name in metrics}
        if not first:
            return []
        self.judged = True
        tolerance = self.config.policy_off_reference.tolerance
        # a NaN is `nonfinite_metric`'s
        off = {n: v for n, v in first.items() if math.isfinite(v) and abs(v) > tolerance}
        if not off:
            return []
        seen = ", ".join(f"{n} {v:.3g}" for n, v in off.items())
        return [self.event(
            signals.step, "warning",
            f"before any update the policy already differs from its reference ({seen}; 0 for "
            "a policy made from its reference): its forward is not the reference's, dropout "
            "left on in the policy, or a reference that is not its starting point",
            param=next(iter(off)), value=next(iter(off.values())), metrics=sorted(off))]

    def state_dict(self) -> dict[str, Any]:
        return {"judged": self.judged}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.judged = bool(state.get("judged", False))
