"""`nonfinite_loss`: the loss is NaN or infinite."""

from __future__ import annotations

from trainguard.detect.base import Detector
from trainguard.events import Event
from trainguard.signals import StepSignals


class NonFiniteLoss(Detector):
    kind = "nonfinite_loss"
    reads = frozenset({"loss"})

    def check(self, signals: StepSignals) -> list[Event]:
        if signals.loss_finite:
            return []
        return [self.event(signals.step, "error", f"loss is {signals.loss}", value=signals.loss)]
