"""`extreme_weight`: some weight's magnitude exceeds `extreme_weight_abs` (1e6, guide §2.1)."""

from __future__ import annotations

import numpy as np

from trainguard.detect.base import Detector
from trainguard.events import Event
from trainguard.signals import StepSignals


class ExtremeWeight(Detector):
    kind = "extreme_weight"
    reads_sampled_only = True

    def check(self, signals: StepSignals) -> list[Event]:
        limit = self.config.extreme_weight_abs
        events = []
        for sample in signals.sampled:
            maxabs = sample.per_param.get("weight_maxabs")
            if maxabs is None:
                continue
            # inf counts as extreme; NaN is nonfinite_weight's business
            bad = np.flatnonzero(np.nan_to_num(maxabs, nan=0.0) > limit)
            if bad.size:
                names = [signals.param_names[i] for i in bad]
                worst = int(bad[np.argmax(np.nan_to_num(maxabs[bad], nan=0.0))])
                events.append(self.event(
                    sample.step, "error",
                    f"|w| up to {maxabs[worst]:.3g} (limit {limit:.0e}) in {len(names)} "
                    f"parameter(s): {self.name_list(names)}",
                    param=signals.param_names[worst], value=float(maxabs[worst]), params=names))
        return events
