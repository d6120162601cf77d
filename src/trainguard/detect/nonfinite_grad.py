"""`nonfinite_grad`: some gradients are NaN or infinite; names the first offending parameters.

Under a GradScaler, an overflow of the *scaled* gradients while the loss is finite is the scaler's
normal calibration (it skips the step and halves the scale): that is not reported here but counted
by `fp16_overflow`. A non-finite gradient with a non-finite loss, or without a scaler, is.
"""

from __future__ import annotations

import math

import numpy as np

from trainguard.detect.base import Detector
from trainguard.detect.calm import SignalColumns
from trainguard.events import Event
from trainguard.signals import StepSignals


class NonFiniteGrad(Detector):
    kind = "nonfinite_grad"
    reads = frozenset({"amp_overflow", "grad_norm", "param_grad_norm", "param_names"})

    def skip_calm(self, columns: SignalColumns, start: int, end: int) -> int:
        """Calm rows: a finite gradient norm, or a skipped step."""
        return columns.next_of("nonfinite_grad",
                               ~np.isfinite(columns.grad_norm) & ~columns.amp_overflow, start, end)

    def check(self, signals: StepSignals) -> list[Event]:
        if signals.grads_finite or signals.amp_overflow:
            return []
        norms = signals.param_grad_norm
        bad = np.flatnonzero(~np.isfinite(norms))
        names = [signals.param_names[i] for i in bad]
        if names:
            what = "NaN" if math.isnan(norms[bad[0]]) else "inf"
            message = (f"{what} gradient in {len(names)} parameter(s) (in the model's "
                       f"order): {self.name_list(names)}")
        else:  # every gradient finite but their total overflowed
            message = f"global gradient norm overflowed to {signals.grad_norm}"
        return [self.event(signals.step, "error", message, param=names[0] if names else None,
                           value=signals.grad_norm, params=names)]
