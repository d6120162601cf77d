"""`margins_exploding`: a preference run's reward margin far past where its loss can still learn.

The DPO loss of a pair is -log sigmoid(margin): at a margin of 10 it is 4.5e-5 and its gradient
as small, every pair already told apart. Margins that keep growing past that (15-23, the
rejected rewards at -19) are not learning the preferences any more: the policy is pushed off its
reference, the rejected completions' probability driven towards 0, which is overfitting the
preference data. It comes from updates too large (the LR) or too many passes over few pairs.
The margins start at 0 (the policy is its reference), so the level the loss saturates at is
the measure. Reported once per episode, as `info`: separated pairs alone harm nothing (a run
whose rejected completions were unlikely to begin with drives them towards 0 and keeps its
chosen ones where they were). The harm shows when the chosen completions lose probability too
(`chosen_likelihood_falling`, a warning), which this event then explains.
"""

from __future__ import annotations

import math
from typing import Any

from trainguard.detect.base import Detector, Episode
from trainguard.detect.trainer_metrics import ACCURACIES, MARGINS, REJECTED_REWARD
from trainguard.events import Event
from trainguard.signals import StepSignals


class MarginsExploding(Detector):
    kind = "margins_exploding"
    reads = frozenset({"trainer_metrics"})
    idle_without = frozenset({"trainer_metrics"})

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.episode = Episode(config.common.rearm_steps)

    def check(self, signals: StepSignals) -> list[Event]:
        metrics = signals.trainer_metrics
        margin = metrics.get(MARGINS)
        if margin is None or not math.isfinite(margin):
            return []  # a NaN margin is `nonfinite_metric`'s
        limit = self.config.margins_exploding.margin
        if not self.episode.update(margin > limit):
            return []
        loss = math.log1p(math.exp(-margin))
        rejected = metrics.get(REJECTED_REWARD)
        accuracy = metrics.get(ACCURACIES)
        seen = []
        if rejected is not None and math.isfinite(rejected):
            seen.append(f"the rejected reward at {rejected:.3g}")
        if accuracy is not None and math.isfinite(accuracy):
            seen.append(f"the accuracy at {accuracy:.2g}")
        detail = f" ({', '.join(seen)})" if seen else ""
        return [self.event(
            signals.step, "info",
            f"the reward margin reached {margin:.3g}{detail}, past {limit:.3g}: the loss of a "
            f"pair is {loss:.2g} there, the pairs are already told apart; margins still growing "
            "push the policy off its reference (overfitting the preferences) when the chosen "
            "completions lose probability too",
            param=MARGINS, value=margin, limit=limit)]

    def state_dict(self) -> dict[str, Any]:
        return {"episode": self.episode.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "episode" in state:
            self.episode.load_state_dict(state["episode"])
