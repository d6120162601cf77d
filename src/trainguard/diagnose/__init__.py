"""Diagnosis: why a run went wrong. The cause catalogue is the vocabulary every part shares.

The names are imported on first use (PEP 562): the catalogue and the cause ranking need no torch,
the preflight audit and the replay do, and importing `trainguard.diagnose.ranking` must not pull
them in.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from trainguard.lazy import lazy_exports

if TYPE_CHECKING:
    from trainguard.diagnose.causes import CAUSES, Cause, cause
    from trainguard.diagnose.counterfactual import Proof, prove
    from trainguard.diagnose.preflight import preflight
    from trainguard.diagnose.replay import ReplayReport, replay
    from trainguard.finding import Finding

_LAZY: dict[str, str] = {
    "CAUSES": "trainguard.diagnose.causes", "Cause": "trainguard.diagnose.causes",
    "cause": "trainguard.diagnose.causes", "Finding": "trainguard.diagnose.finding",
    "preflight": "trainguard.diagnose.preflight", "ReplayReport": "trainguard.diagnose.replay",
    "replay": "trainguard.diagnose.replay", "Proof": "trainguard.diagnose.counterfactual",
    "prove": "trainguard.diagnose.counterfactual",
}

__all__ = ["CAUSES", "Cause", "Finding", "Proof", "ReplayReport", "cause", "preflight", "prove",
           "replay"]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


class _Package(types.ModuleType):
    """`preflight` and `replay` are functions named like the submodules that define them. The
    import system sets a package's attribute to a submodule once it is loaded; an eager
    `__init__` overwrote it with the function afterwards. Here the function keeps the name
    whichever is imported first (the submodules stay in `sys.modules`)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if (isinstance(value, types.ModuleType) and _LAZY.get(name) == value.__name__
                and name in {"preflight", "replay"}):
            value = getattr(value, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
