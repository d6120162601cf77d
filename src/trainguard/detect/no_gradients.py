"""`no_gradients`: the loss is finite yet no watched parameter has a gradient.

Every gradient is None or exactly zero for `detectors.no_gradients.steps` optimizer steps in a row
while the loss is finite: `loss.backward()` was forgotten (or called on another tensor), every
parameter is frozen, or the loss was computed under `torch.no_grad()` / detached, so nothing
trains and the optimizer steps do nothing (or only decay the weights). Reported once per
episode; the message says when the loss handed to the Guard does not require grad, which
points at a detached loss rather than a forgotten backward. A loss of exactly 0 has zero
gradients by right (a saturated cross-entropy on data the model fits perfectly): no alarm.

One such step alone is told as `info` when it is sure: the loss handed to the Guard requires
grad and not one watched parameter has a gradient tensor (`grads_absent`), so backward()
reached none of them (forgotten on one path of the loop, the gradients cleared between
backward() and the step, every parameter frozen) and its optimizer step changed nothing. A step
whose gradients are present and zero (`zero_grad(set_to_none=False)`, a reward with no spread)
is not: zeros are also what a blocked path gives.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from trainguard.detect.base import Detector, Episode
from trainguard.detect.calm import SignalColumns
from trainguard.detect.settings import DetectorConfig
from trainguard.events import Event
from trainguard.signals import StepSignals


class NoGradients(Detector):
    kind = "no_gradients"
    reads = frozenset({"amp_overflow", "grad_norm", "loss", "loss_requires_grad", "grads_absent",
                       "param_names"})

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.streak = 0
        self.episode = Episode(config.common.rearm_steps)

    def check(self, signals: StepSignals) -> list[Event]:
        loss = signals.loss
        if loss is None or not math.isfinite(loss) or signals.amp_overflow or loss == 0.0:
            self.streak = 0 if loss == 0.0 else self.streak
            return []
        empty = signals.grad_norm == 0.0  # NaN compares unequal: a NaN step is not empty
        self.streak = self.streak + 1 if empty else 0
        if not self.episode.update(self.streak >= self.config.no_gradients.steps):
            return self._backward_missed(signals, loss) if self.streak == 1 else []
        first = signals.step - self.streak + 1
        if signals.loss_requires_grad is False:
            why = ("the loss handed to trainguard does not require grad: it was computed "
                   "under torch.no_grad() or detached, so backward() cannot reach the weights")
        else:
            why = ("was loss.backward() called before the step, on this loss? Are all "
                   "parameters frozen (requires_grad=False)?")
        return [self.event(signals.step, "warning",
                           f"no gradients for {self.streak} steps (every gradient None or zero "
                           f"since step {first}) while the loss is finite ({loss:.4g}): nothing "
                           f"is training; {why}",
                           value=float(self.streak), since=first,
                           loss_requires_grad=signals.loss_requires_grad)]

    def _backward_missed(self, signals: StepSignals, loss: float) -> list[Event]:
        """The `info` of one step that backward() did not reach (see the module's text)."""
        absent, names = signals.grads_absent, signals.param_names
        if not (signals.loss_requires_grad and names and absent is not None
                and len(absent) == len(names)):
            return []
        return [self.event(signals.step, "info",
                           f"step {signals.step}: backward() reached no watched parameter (not "
                           f"one has a gradient) although the loss ({loss:.4g}) requires grad: "
                           "loss.backward() not called for this step, the gradients cleared "
                           "before it, or every parameter frozen; its optimizer step changed "
                           "nothing", value=0.0, symptom="backward_missed")]

    def skip_calm(self, columns: SignalColumns, start: int, end: int) -> int:
        """Calm rows, while no streak or episode is under way: any row but one with a finite,
        non-zero loss, no skipped step and a gradient norm of exactly 0."""
        if self.streak or self.episode.active:
            return start
        with np.errstate(invalid="ignore"):
            empty = (np.isfinite(columns.loss) & (columns.loss != 0.0) & ~columns.amp_overflow
                     & (columns.grad_norm == 0.0))
        return columns.next_of("no_gradients", empty, start, end)

    def untrained(self) -> tuple[int, str] | None:
        if self.streak >= self.config.no_gradients.steps:
            return self.streak, "no gradients"
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak, "episode": self.episode.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak = int(state["streak"])
        self.episode.load_state_dict(state["episode"])
