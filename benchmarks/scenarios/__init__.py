"""The fault-scenario suite: real small fine-tunes, healthy or with one known fault.

    python -m benchmarks.scenarios                   # whole suite under trainguard's defaults
    python -m benchmarks.scenarios --strategies none,clip,skip_nonfinite,zclip,trainguard
    python -m benchmarks.scenarios --only gpt2 --list

Importable so tests can run a subset: `all_scenarios()`, `run_scenario(scenario, strategy)`.
"""

from __future__ import annotations

from .base import Scenario, Workload
from .runner import RunResult, run_scenario


def all_scenarios() -> list[Scenario]:
    from .families import FAMILIES

    scenarios: list[Scenario] = []
    for module in FAMILIES:
        scenarios.extend(module.scenarios())
    names = [s.name for s in scenarios]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ValueError(f"duplicate scenario names: {sorted(duplicates)}")
    return scenarios


def scenario(name: str) -> Scenario:
    for s in all_scenarios():
        if s.name == name:
            return s
    raise KeyError(f"no scenario named {name!r}")


__all__ = ["RunResult", "Scenario", "Workload", "all_scenarios", "run_scenario", "scenario"]
