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
each of the last `DetectorConfig.params_unfrozen.steps` steps and is not now. Which of the two it
was is known on the host (`StepSignals.grads_absent`) and said: a parameter whose gradient was
computed on every silent step, all zeros, was neither frozen nor unused; the path to it was
blocked (units that output a constant, a saturated activation downstream) and opened again.

A step without any gradient at all is `no_gradients`' (a forgotten backward), and the step that
ends such a gap is not an unfreezing: it is left out, as is the first step of the run.
Per-parameter norms are already on the host every step; this is a few NumPy operations over one
value per parameter.
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
    budget_us = 15.0  # one gradient norm per parameter, a few NumPy operations
    reads = frozenset({"param_grad_norm", "param_names", "grads_absent"})

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.silent = np.zeros(0, dtype=np.int64)
        """Per parameter: the steps in a row, up to the last one, its gradient norm was zero."""
        self.computed = np.zeros(0, dtype=np.int64)
        """Per parameter: how many of those steps its gradient was there, all zeros."""
        self.all_silent = False
        """The last step had no gradient at all."""
        self.waiting = False
        """Some parameter's gradient norm was zero at the last step (`silent` has a count)."""

    def check(self, signals: StepSignals) -> list[Event]:
        norms = np.asarray(signals.param_grad_norm, dtype=np.float64)
        if norms.shape != self.silent.shape:  # the first step, or parameters added: start over
            self.silent = np.where(norms == 0.0, 1, 0).astype(np.int64)
            self.computed = self.silent * self._present(signals, norms.size)
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
        blocked = woke[self.computed[woke] >= self.silent[woke]]
        self.silent = np.where(zero, self.silent + 1, 0)
        self.computed = np.where(zero, self.computed + self._present(signals, norms.size), 0)
        self.waiting = bool(self.silent.any())
        self.all_silent = bool(zero.size) and bool(zero.all())
        if not woke.size or after_gap:
            return []
        names = [signals.param_names[i] for i in woke]
        if blocked.size == woke.size:
            said = (f"gradients flow again to {len(names)} parameter(s) whose gradients were "
                    f"computed but exactly zero for {quiet} steps or more: none was frozen or "
                    f"unused; the path to them was blocked (a zero scale or gate, units that "
                    f"output a constant, a saturated activation) and has opened: "
                    f"{self.name_list(names)}")
        else:
            also = (f"; {blocked.size} of them had gradients computed but exactly zero (a path "
                    f"blocked, not frozen)" if blocked.size else "")
            said = (f"gradients reach {len(names)} parameter(s) that had none for {quiet} steps "
                    f"or more (a layer unfrozen, or a branch now used): {self.name_list(names)}"
                    f"{also}; they train from here at their group's LR (a spike soon after "
                    "points at that LR: freshly unfrozen layers often want a lower one)")
        return [self.event(signals.step, "info", said, param=names[0], value=float(len(names)),
                           params=names, silent_steps=quiet,
                           blocked=[signals.param_names[i] for i in blocked])]

    @staticmethod
    def _present(signals: StepSignals, size: int) -> np.ndarray:
        """1 where the parameter had a gradient tensor at this step, 0 where it had none or
        where that is not known (a log's rows)."""
        if signals.grads_absent is None:
            return np.zeros(size, dtype=np.int64)
        present = np.ones(size, dtype=np.int64)
        if signals.grads_absent:
            present[list(signals.grads_absent)] = 0
        return present

    def state_dict(self) -> dict[str, Any]:
        return {"silent": [int(v) for v in self.silent], "all_silent": self.all_silent,
                "computed": [int(v) for v in self.computed]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.silent = np.asarray(state.get("silent", []), dtype=np.int64)
        computed = state.get("computed")  # an older state: not known, so not said
        self.computed = (np.asarray(computed, dtype=np.int64) if computed is not None
                         else np.zeros_like(self.silent))
        self.all_silent = bool(state.get("all_silent", False))
        self.waiting = bool(self.silent.any())
