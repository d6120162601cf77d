"""trainguard: keeps PyTorch fine-tuning runs from blowing up.

Watch every optimizer step cheaply, detect NaN/Inf, gradient explosions, loss spikes and
divergence at the step they happen, protect the run, and record everything for later.

The public names are imported on first use (PEP 562): `import trainguard` is cheap and does not
import torch, so the parts that need no model (`trainguard analyze`, the run store reader, the
detectors on logged values) start fast. `trainguard.Guard` imports torch when it is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainguard.lazy import lazy_exports
from trainguard.version import __version__

if TYPE_CHECKING:  # what static tools see; at run time `__getattr__` imports them on demand
    from trainguard import recipes
    from trainguard.checkpoint_health import mark_checkpoint, resume_guard
    from trainguard.checkpoints import last_healthy_checkpoint, list_checkpoints
    from trainguard.config import DetectorConfig, GuardConfig, RecoveryConfig
    from trainguard.diagnose import Finding, preflight, replay
    from trainguard.errors import (
        ConfigError,
        PeerLost,
        SnapshotError,
        StoreError,
        TrainguardError,
        TrainingDiverged,
        UsageError,
    )
    from trainguard.events import Event, StepReport
    from trainguard.guard import Guard
    from trainguard.lifecycle import close_open_runs
    from trainguard.snapshot import load_snapshot
    from trainguard.store import RunReader

_LAZY: dict[str, str] = {
    "recipes": "trainguard.recipes",
    "mark_checkpoint": "trainguard.checkpoint_health",
    "resume_guard": "trainguard.checkpoint_health",
    "last_healthy_checkpoint": "trainguard.checkpoints",
    "list_checkpoints": "trainguard.checkpoints",
    "DetectorConfig": "trainguard.config", "GuardConfig": "trainguard.config",
    "RecoveryConfig": "trainguard.config",
    "Finding": "trainguard.diagnose", "preflight": "trainguard.diagnose",
    "replay": "trainguard.diagnose",
    "ConfigError": "trainguard.errors", "PeerLost": "trainguard.errors",
    "SnapshotError": "trainguard.errors",
    "StoreError": "trainguard.errors", "TrainguardError": "trainguard.errors",
    "TrainingDiverged": "trainguard.errors", "UsageError": "trainguard.errors",
    "Event": "trainguard.events", "StepReport": "trainguard.events",
    "Guard": "trainguard.guard",
    "close_open_runs": "trainguard.lifecycle",
    "load_snapshot": "trainguard.snapshot",
    "RunReader": "trainguard.store",
}
"""Public name -> the module that defines it (a module itself for `recipes`)."""

__all__ = [
    "ConfigError", "DetectorConfig", "Event", "Finding", "Guard", "GuardConfig", "PeerLost",
    "RecoveryConfig", "RunReader",
    "SnapshotError", "StepReport", "StoreError", "TrainguardError", "TrainingDiverged",
    "UsageError", "__version__", "close_open_runs", "last_healthy_checkpoint",
    "list_checkpoints", "load_snapshot",
    "mark_checkpoint", "preflight", "recipes", "replay", "resume_guard",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
