"""`fp16_overflow`: values at the float16 limit, or a GradScaler that keeps overflowing.

A GradScaler starts at its `init_scale` (2**16 by default) and halves its scale at every step
whose scaled gradients overflow, skipping that step; it grows the scale again only after
`growth_interval` (2000) clean steps. So a scale chosen too large is found out at the start of
a run by a run of skips while the scale falls, until it fits the gradients: its calibration,
normal and finite (24 skipped steps from 2**40, none to a few from the default). Overflow that
persists is different: skips that keep coming after the scale settled, or a scale that falls
until it collapses.

Five symptoms, each reported once per episode:
- the calibration (`info`, once, when it ended): the skips of the run's first steps while the
  scale fell, each at a scale below the skip before it, until `CALIBRATION_SETTLED` steps in a
  row passed without one;
- `detectors.fp16_overflow.skips` GradScaler overflow skips within `detectors.fp16_overflow.window`
  steps, counted after the calibration ended and after the first `detectors.fp16_overflow.window`
  steps (`warning`);
- a loss scale that has collapsed below `detectors.fp16_overflow.min_loss_scale` (`error`);
- a float16 activation (sampled steps, under fp16 autocast) above
  `detectors.fp16_overflow.limit_fraction` of 65504, or non-finite, naming the first such module in
  execution order (`warning`);
- float16 gradients above that limit (`warning`).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from trainguard.detect.base import Detector
from trainguard.detect.settings import DetectorConfig
from trainguard.events import Event
from trainguard.signals import StepSignals

FP16_MAX = 65504.0
CALIBRATION_SETTLED = 10
"""Steps in a row without a skip after which the scale has settled: the calibration's skips come
back to back (a step that just fits the scale may pass between two)."""


def scale_text(scale: float | None) -> str:
    """A loss scale as people set it: 65536 (2^16)."""
    if scale is None or not math.isfinite(scale) or scale <= 0:
        return str(scale)
    power = math.log2(scale)
    return f"{scale:.4g} (2^{power:.0f})" if power == round(power) else f"{scale:.4g}"


class ScaleCalibration:
    """The GradScaler's search for its scale at the start of the run: the skips from its first
    `CALIBRATION_SETTLED` steps on while the scale fell. Open until `CALIBRATION_SETTLED` clean
    steps in a row, or until a skip comes at a scale no lower than the skip before it (the scale
    grew back: it is not falling)."""

    def __init__(self) -> None:
        self.open = True
        self.skips = 0
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.first_scale: float | None = None
        self.last_scale: float | None = None
        """The scale of the last skip (the scaler halves it after that step)."""
        self.clean = 0

    def see(self, step: int, overflow: bool, scale: float | None) -> bool:
        """Whether this step's skip belongs to the calibration; closes it when the scale
        settled or stopped falling."""
        if self.open and not self.skips and step >= CALIBRATION_SETTLED:
            self.open = False  # no skip in the run's first steps (or a log that begins later)
        if not self.open:
            return False
        if not overflow:
            self.clean += 1
            self.open = self.clean < CALIBRATION_SETTLED
            return False
        falling = (self.last_scale is None or scale is None
                   or not scale >= self.last_scale)  # NaN or None: nothing says it rose
        if not falling:
            self.open = False
            return False
        self.skips += 1
        self.clean = 0
        self.first_step = step if self.first_step is None else self.first_step
        self.last_step = step
        self.first_scale = scale if self.first_scale is None else self.first_scale
        self.last_scale = scale
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"open": self.open, "skips": self.skips, "first_step": self.first_step,
                "last_step": self.last_step, "first_scale": self.first_scale,
                "last_scale": self.last_scale, "clean": self.clean}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        def number(key: str, kind: type) -> Any:
            value = state.get(key)
            return None if value is None else kind(value)

        self.open = bool(state.get("open", False))  # a state from before: the calibration is over
        self.skips = int(state.get("skips", 0))
        self.first_step, self.last_step = number("first_step", int), number("last_step", int)
        self.first_scale = number("first_scale", float)
        self.last_scale = number("last_scale", float)
        self.clean = int(state.get("clean", 0))


class Fp16Overflow(Detector):
    kind = "fp16_overflow"
    budget_us = 10.0  # the scale and the largest float16 gradient against their history
    reads = frozenset({"amp_overflow", "fp16_grad_maxabs", "loss_scale", "sampled"})

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.overflow_steps: deque[int] = deque()
        self.active: dict[str, bool] = {}
        self.calibration = ScaleCalibration()

    def _once(self, symptom: str, present: bool) -> bool:
        """True the first step a symptom is present; re-armed when it goes away."""
        was = self.active.get(symptom, False)
        self.active[symptom] = present
        return present and not was

    def check(self, signals: StepSignals) -> list[Event]:
        cfg = self.config
        limit = cfg.fp16_overflow.limit_fraction * FP16_MAX
        step = signals.step
        events: list[Event] = []

        for sample in signals.sampled:
            fp16 = sample.per_module.get("act_fp16")
            if fp16 is None:
                continue
            maxabs = sample.per_module["act_maxabs"]
            nonfinite = sample.per_module["act_nonfinite"]
            hot = np.flatnonzero((fp16 > 0) & ((np.nan_to_num(maxabs, nan=np.inf) >= limit)
                                               | (nonfinite > 0)))
            if self._once("activation", bool(hot.size)):
                first = sample.module_names[int(hot[0])]
                events.append(self.event(
                    sample.step, "warning",
                    f"float16 activation of {first} reached {maxabs[hot[0]]:.4g} "
                    f"(float16 max {FP16_MAX:g}); {hot.size} module(s) near the limit",
                    param=first, value=float(maxabs[hot[0]]), symptom="activation",
                    modules=[sample.module_names[int(i)] for i in hot]))

        grad_max = signals.fp16_grad_maxabs
        if self._once("gradient", grad_max is not None and not grad_max < limit):
            events.append(self.event(step, "warning",
                                     f"float16 gradients reached {grad_max:.4g} (float16 max "
                                     f"{FP16_MAX:g})", value=grad_max, symptom="gradient"))

        calibrating = self.calibration.open
        calibration_skip = self.calibration.see(step, signals.amp_overflow, signals.loss_scale)
        if calibrating and not self.calibration.open and self.calibration.skips:
            events.append(self._calibrated(step, signals.loss_scale))
        if signals.amp_overflow and not calibration_skip and step >= cfg.fp16_overflow.window:
            self.overflow_steps.append(step)
        while self.overflow_steps and self.overflow_steps[0] <= step - cfg.fp16_overflow.window:
            self.overflow_steps.popleft()
        frequent = (step >= cfg.fp16_overflow.window
                    and len(self.overflow_steps) >= cfg.fp16_overflow.skips)
        if self._once("skips", frequent):
            calibration = self.calibration
            after = (f", after its calibration (steps {calibration.first_step}-"
                     f"{calibration.last_step})" if calibration.skips else "")
            scale_now = ("" if signals.loss_scale is None
                         else f" (loss scale now {scale_text(signals.loss_scale)})")
            events.append(self.event(step, "warning",
                                     f"GradScaler skipped {len(self.overflow_steps)} of the last "
                                     f"{cfg.fp16_overflow.window} steps for inf/NaN "
                                     f"gradients{after}: the overflow persists{scale_now}",
                                     value=float(len(self.overflow_steps)), symptom="skips",
                                     loss_scale=signals.loss_scale))

        scale = signals.loss_scale
        if self._once("scale", scale is not None and scale < cfg.fp16_overflow.min_loss_scale):
            events.append(self.event(step, "error",
                                     f"AMP loss scale collapsed to {scale:.3g} (below "
                                     f"{cfg.fp16_overflow.min_loss_scale:g}): the model "
                                     "overflows float16 even unscaled", value=scale,
                                     symptom="scale"))
        return events

    def _calibrated(self, step: int, scale: float | None) -> Event:
        c = self.calibration
        return self.event(
            step, "info",
            f"GradScaler calibration: {c.skips} of the steps {c.first_step}-{c.last_step} skipped "
            f"for inf/NaN gradients while the loss scale fell from {scale_text(c.first_scale)} "
            f"to {scale_text(scale)}, steady since: the scaler finding a scale the gradients "
            "fit, down from its init_scale (the skipped steps trained nothing)",
            value=float(c.skips), symptom="calibration", skips=c.skips,
            first_step=c.first_step, last_step=c.last_step, init_scale=c.first_scale,
            loss_scale=scale)

    def state_dict(self) -> dict[str, Any]:
        return {"overflow_steps": list(self.overflow_steps), "active": dict(self.active),
                "calibration": self.calibration.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.overflow_steps = deque(int(s) for s in state["overflow_steps"])
        self.active = {k: bool(v) for k, v in state["active"].items()}
        self.calibration = ScaleCalibration()
        self.calibration.load_state_dict(state.get("calibration", {}))
