"""`fp16_overflow`: values at the float16 limit, or a GradScaler that keeps overflowing.

Four symptoms, each reported once per episode:
- a float16 activation (sampled steps, under fp16 autocast) above `fp16_limit_fraction` of 65504,
  or non-finite, naming the first such module in execution order;
- float16 gradients above that limit;
- `overflow_skips` GradScaler overflow skips within `overflow_window` steps, after the scaler's
  initial calibration (the first `overflow_window` steps);
- a loss scale that has collapsed below `min_loss_scale`.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from trainguard.config import DetectorConfig
from trainguard.detect.base import Detector
from trainguard.events import Event
from trainguard.signals import StepSignals

FP16_MAX = 65504.0


class Fp16Overflow(Detector):
    kind = "fp16_overflow"
    reads = frozenset({"amp_overflow", "fp16_grad_maxabs", "loss_scale", "sampled"})

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.overflow_steps: deque[int] = deque()
        self.active: dict[str, bool] = {}

    def _once(self, symptom: str, present: bool) -> bool:
        """True the first step a symptom is present; re-armed when it goes away."""
        was = self.active.get(symptom, False)
        self.active[symptom] = present
        return present and not was

    def check(self, signals: StepSignals) -> list[Event]:
        cfg = self.config
        limit = cfg.fp16_limit_fraction * FP16_MAX
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

        if signals.amp_overflow and step >= cfg.overflow_window:  # ignore initial calibration
            self.overflow_steps.append(step)
        while self.overflow_steps and self.overflow_steps[0] <= step - cfg.overflow_window:
            self.overflow_steps.popleft()
        frequent = step >= cfg.overflow_window and len(self.overflow_steps) >= cfg.overflow_skips
        if self._once("skips", frequent):
            events.append(self.event(step, "warning",
                                     f"GradScaler skipped {len(self.overflow_steps)} of the last "
                                     f"{cfg.overflow_window} steps for inf/NaN gradients",
                                     value=float(len(self.overflow_steps)), symptom="skips",
                                     loss_scale=signals.loss_scale))

        scale = signals.loss_scale
        if self._once("scale", scale is not None and scale < cfg.min_loss_scale):
            events.append(self.event(step, "error",
                                     f"AMP loss scale collapsed to {scale:.3g} (below "
                                     f"{cfg.min_loss_scale:g}): the model overflows float16 even "
                                     "unscaled", value=scale, symptom="scale"))
        return events

    def state_dict(self) -> dict[str, Any]:
        return {"overflow_steps": list(self.overflow_steps), "active": dict(self.active)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.overflow_steps = deque(int(s) for s in state["overflow_steps"])
        self.active = {k: bool(v) for k, v in state["active"].items()}
