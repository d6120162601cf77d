"""`extreme_weight`: some weight's magnitude exceeds `detectors.extreme_weight.abs_limit` (1e6,
guide §2.1).

Reported when a parameter first crosses the limit, not again on every sampled step while it
stays above (an event makes the next step sampled, so repeating it would sample every step and
say the same thing each time); a parameter that comes back below the limit can be reported
again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainguard.detect.base import Detector
from trainguard.events import Event
from trainguard.signals import StepSignals


class ExtremeWeight(Detector):
    kind = "extreme_weight"
    reads = frozenset({"param_names", "sampled"})
    idle_without = frozenset({"sampled"})
    reads_sampled_only = True

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.above: set[str] = set()
        """Parameters reported above the limit and not seen back below it since."""

    def check(self, signals: StepSignals) -> list[Event]:
        limit = self.config.extreme_weight.abs_limit
        events = []
        for sample in signals.sampled:
            maxabs = sample.per_param.get("weight_maxabs")
            if maxabs is None:
                continue
            # inf counts as extreme; NaN is nonfinite_weight's business
            values = np.nan_to_num(maxabs, nan=0.0)
            bad = np.flatnonzero(values > limit)
            now = {signals.param_names[i] for i in bad}
            self.above &= now
            fresh = [i for i in bad if signals.param_names[i] not in self.above]
            if fresh:
                names = [signals.param_names[i] for i in fresh]
                worst = int(fresh[int(np.argmax(values[fresh]))])
                events.append(self.event(
                    sample.step, "error",
                    f"|w| up to {maxabs[worst]:.3g} (limit {limit:.0e}) in {len(names)} "
                    f"parameter(s): {self.name_list(names)}",
                    param=signals.param_names[worst], value=float(maxabs[worst]), params=names))
                self.above |= set(names)
        return events

    def state_dict(self) -> dict[str, Any]:
        return {"above": sorted(self.above)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.above = set(state.get("above", []))
