"""`preference_unlearned`: a preference run (DPO, KTO) whose policy never left its reference.

The implicit rewards are `beta` times the policy's log-probability ratio to the reference
model: both 0 at the first step by construction, they move at the first update of a policy
that learns. Both exactly 0 for `detectors.preference_unlearned.steps` steps in a row (the
loss pinned at ln 2 = 0.6931 in DPO) means nothing is learned: the LR is 0, or the reference
model is the policy itself (its log-probabilities move with the policy's). Reported once per
episode, with the LR the step had.
"""

from __future__ import annotations

import math

from trainguard.detect.base import UnlearnedStreak
from trainguard.detect.trainer_metrics import CHOSEN_REWARD, REJECTED_REWARD, is_zero
from trainguard.events import Event
from trainguard.signals import StepSignals


class PreferenceUnlearned(UnlearnedStreak):
    kind = "preference_unlearned"
    reads = frozenset({"trainer_metrics", "lr", "loss"})
    idle_without = frozenset({"trainer_metrics"})
    raises_from = frozenset({"trainer_metrics"})
    unlearned = "the chosen and rejected rewards exactly 0 (the policy never left its reference)"

    @property
    def needed(self) -> int:
        return self.config.preference_unlearned.steps

    def check(self, signals: StepSignals) -> list[Event]:
        metrics = signals.trainer_metrics
        if CHOSEN_REWARD not in metrics or REJECTED_REWARD not in metrics:
            return []
        still = is_zero(metrics[CHOSEN_REWARD]) and is_zero(metrics[REJECTED_REWARD])
        if not self.count(still):
            return []
        lr = signals.lr
        loss = signals.loss
        at = f" (the loss is {loss:.4g}; ln 2 = {math.log(2):.4f})" if loss is not None else ""
        if lr is not None and lr == 0:
            cause = "lr_too_low"
            why = "the learning rate is 0: the policy is not updated"
        else:
            cause = "reference_is_policy"
            why = ("the policy is updated yet its log-probabilities stay the reference's: the "
                   "reference model is the policy itself")
        return [self.event(
            signals.step, "warning",
            f"the chosen and rejected rewards have been exactly 0 for {self.streak} steps{at}: "
            f"the policy never left its reference, nothing is learned; {why}",
            value=loss, cause=cause, steps=self.streak, lr=lr)]
