"""`params_unfrozen`: parameters that had no gradient for a while get one again.

A layer unfrozen mid-run (a backbone released after the head has settled, progressive
unfreezing, `requires_grad_(True)` in the loop), or a branch of the model that starts to be
used, begins to train at its parameter group's LR on the step its gradients first reach it. That
is a change to the training as large as an LR jump, and a classic source of a spike a few
steps later (the freshly unfrozen layers at the head's LR), so it is reported, as information:
the timeline then shows it before the trouble. It casts no vote: an unfreezing is routine, and
trouble after it has causes of its own (a DDP run whose unfrozen backbone drifts apart across
ranks is `ddp_desync`'s, not the LR's).

A parameter counts when its gradient norm was exactly zero (no gradient, or an all-zero one) on
each of the last `DetectorConfig.params_unfrozen.steps` steps and is not now. A step without any
gradient at all is `no_gradients`' (a forgotten backward), and the step that ends such a gap is not
an unfreezing: it is left out, as is the first step of the run. Per-parameter norms are already on
the host every step; this is a few NumPy operations over one value per parameter.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainguard.detect.base import Detector
from trainguard.detect.settings import DetectorConfig
from trainguard.events import Event
from trainguard.signals import StepSignals


class ParamsUnfrozen(Detector):
    kind = "params_unfrozen"
    reads = frozenset({"param_grad_norm", "param_names"})

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.silent = np.zeros(0, dtype=np.int64)
        """Per parameter: the steps in a row, up to the last one, its gradient norm was zero."""
        self.all_silent = False
        """The last step had no gradient at all."""
        self.waiting = False
        """Some parameter's gradient norm was zero at the last step (`silent` has a count)."""

    def check(self, signals: StepSignals) -> list[Event]:
        norms = np.asarray(signals.param_grad_norm, dtype=np.float64)
        if norms.shape != self.silent.shape:  # the first step, or parameters added: start over
            self.silent = np.where(norms == 0.0, 1, 0).astype(np.int64)
            self.waiting = bool(self.silent.any())
            self.all_silent = bool(norms.size) and not norms.any()
            return []
        # the usual step: nothing was or is silent (a NaN gradient is a gradient, and nonzero)
        if not self.waiting and norms.all():
            self.all_silent = False
            return []
        zero = norms == 0.0  # NaN compares unequal: a NaN gradient is a gradient
        woke = np.flatnonzero(~zero & (self.silent >= self.config.params_unfrozen.steps))
        quiet = int(self.silent[woke].min()) if woke.size else 0
        after_gap = self.all_silent
        self.silent = np.where(zero, self.silent + 1, 0)
        self.waiting = bool(self.silent.any())
        self.all_silent = bool(zero.size) and bool(zero.all())
        if not woke.size or after_gap:
            return []
        names = [signals.param_names[i] for i in woke]
        return [self.event(
            signals.step, "info",
            f"gradients reach {len(names)} parameter(s) that had none for {quiet} steps or more "
            f"(a layer unfrozen, or a branch now used): {self.name_list(names)}; they train "
            "from here at their group's LR (a spike soon after points at that LR: freshly "
            "unfrozen layers often want a lower one)",
            param=names[0], value=float(len(names)), params=names, silent_steps=quiet)]

    def state_dict(self) -> dict[str, Any]:
        return {"silent": [int(v) for v in self.silent], "all_silent": self.all_silent}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.silent = np.asarray(state.get("silent", []), dtype=np.int64)
        self.all_silent = bool(state.get("all_silent", False))
        self.waiting = bool(self.silent.any())
