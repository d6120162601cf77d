"""Which detectors a live step can concern: those whose inputs the step holds.

A detector declares `Detector.idle_without`: optional step fields without which its `check`
raises nothing and moves no state (the RL detectors without a trainer's metrics, the
sampled-probe detectors between sampled steps). On a plain loop's usual step most of them are
idle; leaving them out saves their calls, about 20 us of host Python a step on the MLP workload
of `benchmarks/overhead.py`, where the Guard's whole host work is a few hundred. The lists are
built once per shape of step (which of the fields it holds), so a step pays one lookup.
"""

from __future__ import annotations

from collections.abc import Callable

from trainguard.detect.base import Detector
from trainguard.detect.instability_precursor import InstabilityPrecursor
from trainguard.signals import StepSignals

OPTIONAL: dict[str, Callable[[StepSignals], bool]] = {
    "trainer_metrics": lambda s: bool(s.trainer_metrics),
    "sampled": lambda s: bool(s.sampled),
}
"""The fields a detector may be idle without, and whether a step holds each."""


_HOLDS = tuple(OPTIONAL.values())


def held_mask(signals: StepSignals) -> int:
    """Bit i set: the step holds the i-th field of `OPTIONAL`."""
    held = 0
    for bit, holds in enumerate(_HOLDS):
        if holds(signals):
            held |= 1 << bit
    return held


def _bit(field: str) -> int:
    return 1 << list(OPTIONAL).index(field)


def is_idle(detector: Detector, held: int) -> bool:
    """Whether `check` is a no-op on a step that holds the fields of `held` (`held_mask`)."""
    idle = detector.idle_without
    return bool(idle) and not any(held & _bit(field) for field in idle)


class OnDuty:
    """The detectors of a run that each shape of step concerns, in the run's order."""

    def __init__(self, detectors: list[Detector]) -> None:
        self.detectors = detectors
        self._by_held: dict[int, list[Detector]] = {}
        self.precursor = next((d for d in detectors if isinstance(d, InstabilityPrecursor)),
                              None)
        """The precursor detector, whose cadence schedules the probes before each step."""

    def of(self, signals: StepSignals) -> list[Detector]:
        held = held_mask(signals)
        found = self._by_held.get(held)
        if found is None:
            found = self._by_held[held] = [d for d in self.detectors if not is_idle(d, held)]
        return found
