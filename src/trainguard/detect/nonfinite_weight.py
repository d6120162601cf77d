"""`nonfinite_weight`: weights hold NaN or inf (checked on sampled steps); names the parameters."""

from __future__ import annotations

import numpy as np

from trainguard.detect.base import Detector
from trainguard.events import Event
from trainguard.signals import StepSignals


class NonFiniteWeight(Detector):
    kind = "nonfinite_weight"
    reads = frozenset({"param_names", "sampled"})
    idle_without = frozenset({"sampled"})
    reads_sampled_only = True

    def check(self, signals: StepSignals) -> list[Event]:
        events = []
        for sample in signals.sampled:
            counts = sample.per_param.get("weight_nonfinite")
            if counts is None:
                continue
            bad = np.flatnonzero(counts > 0)
            if bad.size:
                names = [signals.param_names[i] for i in bad]
                events.append(self.event(
                    sample.step, "error",
                    f"non-finite weights in {len(names)} parameter(s): {self.name_list(names)}",
                    param=names[0], value=float(counts[bad[0]]), params=names))
        return events
