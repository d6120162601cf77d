"""`dead_units`: a layer that was alive has gone dead, or gives every sample the same output.

Read from the activation probe on sampled steps (`act_dead_frac`, `act_batch_spread`). A module is
*dead* when at least `detectors.dead_units.share` (95%) of its units are zero for every sample of
the batch (ReLUs pushed below zero by one too large update stay there: their gradient is zero too),
and *collapsed* when its output hardly varies across the batch (spread below
`detectors.dead_units.spread` relative to its magnitude). Either counts only for a module that was
seen alive and varied at an earlier sampled step: a fresh model that starts sparse, or a layer that
is constant by design, is not an alarm. A healthy ReLU layer shows about half its values at zero at
any one time, but almost none of its units are zero for a whole batch.
"""

from __future__ import annotations

import math
from typing import Any

from trainguard.detect.base import Detector
from trainguard.events import Event
from trainguard.signals import StepSignals


class DeadUnits(Detector):
    kind = "dead_units"
    reads = frozenset({"sampled"})
    idle_without = frozenset({"sampled"})
    reads_sampled_only = True

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.alive: dict[str, bool] = {}
        """Modules seen alive (dead share below the limit) at some sampled step."""
        self.varied: dict[str, bool] = {}
        """Modules seen with outputs that vary across the batch."""
        self.reported: set[str] = set()

    def check(self, signals: StepSignals) -> list[Event]:
        cfg = self.config
        events = []
        for sample in signals.sampled:
            dead = sample.per_module.get("act_dead_frac")
            spread = sample.per_module.get("act_batch_spread")
            if dead is None or spread is None:
                continue
            found: list[tuple[str, str, float]] = []
            for name, share, varies in zip(sample.module_names, dead, spread, strict=True):
                share, varies = float(share), float(varies)
                if not (math.isfinite(share) and math.isfinite(varies)):
                    continue  # non-finite activations are nonfinite_* business
                if share >= cfg.dead_units.share:
                    if self.alive.get(name) and name not in self.reported:
                        found.append((name, "dead", share))
                elif varies <= cfg.dead_units.spread:
                    if self.varied.get(name) and name not in self.reported:
                        found.append((name, "constant", varies))
                if share < cfg.dead_units.share:
                    self.alive[name] = True
                if varies > cfg.dead_units.spread:
                    self.varied[name] = True
            if not found:
                continue
            self.reported.update(name for name, _, _ in found)
            name, how, value = max(found, key=lambda f: f[1] == "dead")
            others = [n for n, _, _ in found if n != name]
            if how == "dead":
                message = (f"{name}: {value:.0%} of its units are zero for every sample of the "
                           "batch (they were alive before): dead units that no longer learn")
            else:
                message = (f"{name}: its output is the same for every sample of the batch "
                           f"(spread {value:.2g} of its magnitude; it varied before)")
            if others:
                message += f"; also {self.name_list(others)}"
            events.append(self.event(sample.step, "warning", message, param=name, value=value,
                                     modules=[n for n, _, _ in found], how=how))
        return events

    def state_dict(self) -> dict[str, Any]:
        return {"alive": sorted(self.alive), "varied": sorted(self.varied),
                "reported": sorted(self.reported)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.alive = dict.fromkeys(state["alive"], True)
        self.varied = dict.fromkeys(state["varied"], True)
        self.reported = set(state["reported"])
