"""`update_too_large`: the first update measured moved the typical weight by a large share.

Read from the weight probe's `update_ratio` (||W_after - W_before|| / max(||W_before||,
||W_after||), sampled steps; the run's first step is sampled): the median over the watched
parameters of the first update trainguard measured. A healthy fine-tuning step moves a weight by
0.1-1% of its norm, a layer trained from scratch a few percent on its first steps; when the
typical weight moves by `detectors.update_too_large.first_ratio` (15%) or more in one step, an LR
this high rewrites the weights within a few steps. The loss does not have to blow up for that to
hurt: a recurrent model whose gates saturate trains on, at twice the loss it could reach, and
nothing else looks wrong.

The median, not the largest: one layer drawn from scratch (a new head) may move far more than
the rest on its first step, which is no fault. Only the weights of real layers count, tensors of
`MIN_ELEMENTS` or more (biases, norms' scales and the layers of a toy regression, whose first
steps move them by half their size as they should, have no say), and not a weight that was all
zeros before the update (LoRA's B): it has no size to compare with, and its ratio is exactly 1
(the update is the weight itself). Checked once, on the first measured update: afterwards the
loss, gradient and LR detectors see a too-large step for themselves.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainguard.detect.base import Detector
from trainguard.events import Event
from trainguard.signals import StepSignals

SIGNAL = "update_ratio"
FROM_ZERO = 1.0
"""The update ratio of a weight that was all zeros before the step: the update is the weight."""
MIN_ELEMENTS = 1024
"""The least number of elements of a weight that counts (a 32 x 32 matrix)."""


def elements(per_param: dict[str, np.ndarray]) -> np.ndarray | None:
    """Each parameter's number of elements, from the weight probe's own statistics (its norm
    squared over its mean square, std^2 + mean^2: how the probe derived the std); None when they
    were not measured."""
    norm, std, mean = (per_param.get(k) for k in ("weight_norm", "weight_std", "weight_mean"))
    if norm is None or std is None or mean is None:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(norm, np.float64) ** 2 / (np.asarray(std, np.float64) ** 2
                                                    + np.asarray(mean, np.float64) ** 2)


class UpdateTooLarge(Detector):
    kind = "update_too_large"
    reads = frozenset({"param_names", "sampled"})
    idle_without = frozenset({"sampled"})
    reads_sampled_only = True
    judges_start = True

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.done = False

    def check(self, signals: StepSignals) -> list[Event]:
        if self.done:
            return []
        for sample in signals.sampled:
            ratios = sample.per_param.get(SIGNAL)
            if ratios is None:
                continue
            values = np.asarray(ratios, dtype=np.float64)
            if not np.isfinite(values).any():
                continue  # non-finite weights: not a measured update (nonfinite_weight's)
            self.done = True  # the first measured update, whatever it holds
            counts = elements(sample.per_param)
            # float32 statistics: the count is exact to a few parts in a million
            large = (np.ones(len(values), dtype=bool) if counts is None
                     else np.nan_to_num(counts, nan=0.0) >= MIN_ELEMENTS * 0.999)
            sized = np.flatnonzero(np.isfinite(values) & (values != FROM_ZERO) & large)
            if not len(sized):
                return []  # no weight of a real layer with a size to compare with
            typical = float(np.median(values[sized]))
            bound = self.config.update_too_large.first_ratio
            if typical < bound:
                return []
            names = signals.param_names
            worst = int(sized[int(np.argmax(values[sized]))])
            largest = names[worst] if worst < len(names) else str(worst)
            return [self.event(
                sample.step, "warning",
                f"the update of step {sample.step} moved the typical weight by "
                f"{typical:.0%} of its norm (median ||dW||/||W|| over {len(sized)} "
                f"weight{'s' if len(sized) != 1 else ''} of "
                f"{MIN_ELEMENTS}+ elements; the most, {values[worst]:.0%}, {largest}): a healthy "
                f"fine-tuning step moves weights by 0.1-1%, and at this LR the weights are "
                f"rewritten within a few steps",
                param=largest, value=typical, signal=SIGNAL, bound=bound,
                largest=float(values[worst]), params=len(sized))]
        return []

    def state_dict(self) -> dict[str, Any]:
        return {"done": self.done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.done = bool(state.get("done", False))
