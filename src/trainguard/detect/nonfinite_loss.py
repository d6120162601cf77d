"""`nonfinite_loss`: the loss is NaN or infinite."""

from __future__ import annotations

import numpy as np

from trainguard.detect.base import Detector
from trainguard.detect.calm import SignalColumns
from trainguard.events import Event
from trainguard.signals import StepSignals


class NonFiniteLoss(Detector):
    kind = "nonfinite_loss"
    reads = frozenset({"loss"})

    def check(self, signals: StepSignals) -> list[Event]:
        if signals.loss_finite:
            return []
        return [self.event(signals.step, "error", f"loss is {signals.loss}", value=signals.loss)]

    def skip_calm(self, columns: SignalColumns, start: int, end: int) -> int:
        """Calm rows: no loss, or a finite one."""
        return columns.next_of("nonfinite_loss", columns.has_loss & ~np.isfinite(columns.loss),
                               start, end)
