"""`nonfinite_optimizer_state`: optimizer moments (e.g. Adam's exp_avg_sq) hold NaN or inf.

A poisoned moment keeps producing bad updates after the gradients are healthy again.
"""

from __future__ import annotations

import numpy as np

from trainguard.detect.base import Detector
from trainguard.events import Event
from trainguard.signals import StepSignals


class NonFiniteOptimizerState(Detector):
    kind = "nonfinite_optimizer_state"
    reads = frozenset({"param_names", "sampled"})
    idle_without = frozenset({"sampled"})
    reads_sampled_only = True

    def check(self, signals: StepSignals) -> list[Event]:
        events = []
        for sample in signals.sampled:
            bad: set[int] = set()
            keys = []
            for key, values in sample.per_param.items():
                if key.startswith("optstate_") and key.endswith("_norm"):
                    idx = np.flatnonzero(~np.isfinite(values))
                    if idx.size:
                        bad.update(int(i) for i in idx)
                        keys.append(key[len("optstate_"):-len("_norm")])
            if bad:
                names = [signals.param_names[i] for i in sorted(bad)]
                events.append(self.event(
                    sample.step, "error",
                    f"optimizer state ({', '.join(keys)}) is non-finite for "
                    f"{len(names)} parameter(s): {self.name_list(names)}",
                    param=names[0], params=names, state_keys=keys))
        return events
