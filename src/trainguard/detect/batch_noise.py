"""How much of a gradient's rise the step's own batch explains: its size and its loss.

A batch's gradient is the mean over its elements (a language model's tokens, a regressor's
samples) of the slopes of their losses. Against a second moment such as Adam's v, which remembers
the batches of the steps before, two kinds of batch lift g^2 with nothing wrong with the weights:

- a smaller one: the gradient's noise has a variance that falls as 1/N with the N elements it
  averages, so a batch of fewer elements than the typical one lifts g^2 by up to
  N_typical / N (all of it when the gradient is mostly noise). Length curricula that restart,
  `group_by_length` samplers and an epoch's short tail hand the step such batches;
- a harder one: a batch whose loss is k times the typical loss (samples further from the fit,
  as heavy-tailed targets give now and then) has slopes about sqrt(k) times steeper (exactly so
  for squared errors), so g^2 about k times larger.

So a detector that compares a gradient-based ratio sqrt(g^2 / v) with its own median takes off
the square root of what the batch explains first: sqrt(N_typical / N) times sqrt(k). Never the
other way: a larger or easier batch is given nothing. The typical size and loss are the medians
over the last `window` steps (the steps the ratio's median is taken over); the size is read from
the batch's shape on the host (`StepSignals.batch_elements`) and the loss is the step's own: no
transfer.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

MIN_LOSSES = 10
"""Losses seen before the loss's part is judged (the first steps' losses fall fast)."""


class BatchNoise:
    def __init__(self, window: int) -> None:
        self.sizes: deque[int] = deque(maxlen=window)
        self.losses: deque[float] = deque(maxlen=window)
        self.typical: float | None = None
        """The typical batch size the last call compared with (None: no size was known)."""
        self.size_part = 0.0
        self.loss_part = 0.0
        """The last call's log discount for the batch's size and for its loss."""

    def log_discount(self, elements: int | None, loss: float | None) -> float:
        """The log of the rise in sqrt(g^2 / v) that this step's batch explains against the
        typical one so far (0 when nothing is known), then remember the batch."""
        self.size_part = self.loss_part = 0.0
        self.typical = None
        if elements is not None and elements > 0:
            typical = statistics.median(self.sizes) if self.sizes else elements
            self.sizes.append(int(elements))
            self.typical = typical
            self.size_part = 0.5 * math.log(typical / elements) if elements < typical else 0.0
        if loss is not None and math.isfinite(loss) and loss > 0:
            if len(self.losses) >= MIN_LOSSES:
                level = statistics.median(self.losses)
                self.loss_part = 0.5 * math.log(loss / level) if loss > level > 0 else 0.0
            self.losses.append(float(loss))
        return self.size_part + self.loss_part

    def state_dict(self) -> dict[str, Any]:
        return {"sizes": list(self.sizes), "losses": list(self.losses)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sizes.clear()
        self.sizes.extend(int(v) for v in state.get("sizes", []))
        self.losses.clear()
        self.losses.extend(float(v) for v in state.get("losses", []))
