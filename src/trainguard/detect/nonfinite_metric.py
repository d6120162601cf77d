"""`nonfinite_metric`: a trainer's metric of the step is NaN or inf while its loss is not.

Rewards, log-probabilities, KL or margins that go NaN (fp16 DPO, ORPO's `log1p(-exp(logp))`,
a reward function's overflow) can leave the loss finite; a trainer that averages its metrics
over the logging window and drops the NaNs, and the Trainer's `logging_nan_inf_filter`, hide
them from the log. Only metrics of the model's outputs and of its training signal are judged
(`trainer_metrics.is_judged`), not bookkeeping a trainer leaves NaN by design. Reported once
per metric and episode.
"""

from __future__ import annotations

import math
from typing import Any

from trainguard.detect.base import Detector
from trainguard.detect.trainer_metrics import is_judged
from trainguard.events import Event
from trainguard.signals import StepSignals


class NonFiniteMetric(Detector):
    kind = "nonfinite_metric"
    budget_us = 10.0  # every metric the trainer handed over is looked at for NaN
    reads = frozenset({"trainer_metrics", "loss"})
    idle_without = frozenset({"trainer_metrics"})
    raises_from = frozenset({"trainer_metrics"})

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.active: set[str] = set()
        """Metrics whose non-finite episode is on."""

    def check(self, signals: StepSignals) -> list[Event]:
        bad = sorted(name for name, value in signals.trainer_metrics.items()
                     if not math.isfinite(value) and is_judged(name))
        for name in list(self.active):
            if name in signals.trainer_metrics and name not in bad:
                self.active.discard(name)  # finite again: re-armed
        if not signals.loss_finite:
            return []  # the loss's own event says it
        new = [name for name in bad if name not in self.active]
        self.active.update(new)
        if not new:
            return []
        values = {name: signals.trainer_metrics[name] for name in new}
        shown = ", ".join(f"{name}={value}" for name, value in values.items())
        return [self.event(signals.step, "error",
                           f"the trainer's metrics went non-finite while the loss did not: "
                           f"{shown}", param=new[0], value=values[new[0]], metrics=new)]

    def state_dict(self) -> dict[str, Any]:
        return {"active": sorted(self.active)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.active = set(state.get("active", []))
