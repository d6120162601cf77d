"""trainguard: keeps PyTorch fine-tuning runs from blowing up.

Watch every optimizer step cheaply, detect NaN/Inf, gradient explosions, loss spikes and
divergence at the step they happen, protect the run, and record everything for later.
"""

__version__ = "0.1.0"

from trainguard import recipes
from trainguard.config import DetectorConfig, GuardConfig, RecoveryConfig
from trainguard.diagnose import Finding, preflight, replay
from trainguard.errors import (
    ConfigError,
    SnapshotError,
    StoreError,
    TrainguardError,
    TrainingDiverged,
    UsageError,
)
from trainguard.events import Event, StepReport
from trainguard.guard import Guard
from trainguard.snapshot import load_snapshot
from trainguard.store import RunReader

__all__ = [
    "ConfigError", "DetectorConfig", "Event", "Finding", "Guard", "GuardConfig", "RecoveryConfig",
    "RunReader",
    "SnapshotError", "StepReport", "StoreError", "TrainguardError", "TrainingDiverged",
    "UsageError", "__version__", "load_snapshot", "preflight", "recipes", "replay",
]
