"""Exceptions raised by trainguard. Each carries one clear message meant for a person."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainguard.events import Event, StepReport


class TrainguardError(Exception):
    """Base class: a problem the user can fix, reported as one clear message."""


class ConfigError(TrainguardError, ValueError):
    """A configuration value is invalid; the message names the field."""


class UsageError(TrainguardError, ValueError):
    """The Guard was given objects it cannot work with (wrong model, loss or optimizer)."""


class BatchError(UsageError):
    """A batch cannot be fed to the model (e.g. token ids beyond the embedding table)."""


class StoreError(TrainguardError):
    """A run directory is missing, corrupt or not a trainguard run."""


class StoreUnavailable(StoreError):
    """A run directory cannot hold a run store (not a directory, read-only, disk full, or a
    trainguard.db that is not a trainguard store). Nothing was created; training can go on
    without the store."""


class RunDirInUse(UsageError):
    """Another live writer (another process, or another store in this process) holds the run
    directory; two runs never interleave in one directory."""

    def __init__(self, message: str, *, run_dir: str = "", pid: int | None = None) -> None:
        super().__init__(message)
        self.run_dir = run_dir
        self.pid = pid
        """The process holding the directory, when it could be read."""


class PeerLost(TrainguardError):
    """Under torch.distributed, one of trainguard's own collectives failed: a rank died, or
    stopped answering for longer than `GuardConfig.distributed.collective_timeout_s`. The ranks can
    no longer agree on their steps, so the run was closed (status "failed", with a `peer_lost` event
    saying why) and training stops on every rank that is left."""

    def __init__(self, message: str, *, ranks: list[int] | None = None, step: int | None = None
                 ) -> None:
        super().__init__(message)
        self.ranks = ranks
        """The ranks that did not answer the roll call after the failure (None when it could not
        be held: the process group's store was unreachable too)."""
        self.step = step
        """The step whose collective failed, when known."""


class SnapshotError(TrainguardError):
    """A crash snapshot cannot be read."""


class TrainingDiverged(TrainguardError):
    """Raised by the `halt` policy: training went bad and a crash snapshot was written.

    `snapshot_path` is where the state from just before the bad update lies (None if it could not
    be written), `events` the events that caused the halt and `report` the final StepReport.
    """

    def __init__(self, message: str, *, snapshot_path: str | None, events: list[Event],
                 report: StepReport | None = None, diagnosis: list[Any] | None = None) -> None:
        super().__init__(message)
        self.snapshot_path = snapshot_path
        self.events = events
        self.report = report
        self.diagnosis = diagnosis or []
        """Ranked likely causes (trainguard.diagnose.ranking.RankedCause), most likely first."""
