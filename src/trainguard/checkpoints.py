"""Checkpoint sidecars: what a checkpoint on disk knows of the run's health when it was saved.

Every checkpoint trainguard sees saved (the HF Trainer's `on_save`, Lightning's `ModelCheckpoint`,
a plain loop's `trainguard.mark_checkpoint(path, guard)`) gets a small JSON sidecar:

- an HF checkpoint folder: `checkpoint-30/trainguard.json`;
- a file (a Lightning `.ckpt`, a plain `torch.save`): `epoch=0-step=30.ckpt.trainguard.json`
  next to it.

It holds the step, the run's health at that step (`healthy`, `incident`: inside an incident,
`recovered`: after a rollback), whether every weight and optimizer moment was finite, the open
events, the verdict so far, and the checkpoint's fingerprint (each file's size and modification
time): a checkpoint written again at the same path no longer matches, so an old sidecar never
describes a new checkpoint (`stale`). The Guard's own state goes to a companion file
(`trainguard_state.pt`, written by `checkpoint_health`).

This module reads and writes the JSON only and imports no torch, so `trainguard checkpoints`
starts fast; the finiteness check and the state file are in `checkpoint_health.py`.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainguard.errors import TrainguardError

SIDECAR = "trainguard.json"
"""The sidecar's name inside a checkpoint folder (and its suffix after a checkpoint file)."""
STATE_FILE = "trainguard_state.pt"
"""The Guard's state (`Guard.state_dict()`) saved with the checkpoint."""
POISONED_SUFFIX = ".poisoned"
"""A blocked poisoned checkpoint is renamed `<name>.poisoned`."""
FORMAT = 1
MAX_SIDECAR_BYTES = 1_000_000
"""A sidecar is a few kilobytes; a larger file is not one of trainguard's."""

Health = Literal["healthy", "incident", "recovered"]
CheckpointStatus = Literal["healthy", "incident", "recovered", "poisoned", "stale"]
RESUMABLE: tuple[str, ...] = ("healthy", "recovered")
"""The statuses `last_healthy_checkpoint` resumes from: finite, outside an incident."""


class CheckpointError(TrainguardError):
    """A folder holds no checkpoint sidecar, or a sidecar that is not trainguard's."""


@dataclass(slots=True)
class CheckpointHealth:
    """What one sidecar says."""

    step: int
    health: Health
    weights_finite: bool
    optimizer_finite: bool | None
    """None when no optimizer was given (or it holds no state yet)."""
    policy: str
    verdict: str | None = None
    """The run's verdict so far (`healthy`, `recovered`, `degraded`, `stalled`), when known."""
    open_events: list[dict[str, Any]] = field(default_factory=list)
    """The events of the incident the run is in at this step (kind, step, severity)."""
    fingerprint: dict[str, list[int]] = field(default_factory=dict)
    """Each file of the checkpoint (relative path) -> [size, mtime_ns] when it was marked."""
    state_file: str | None = None
    """The companion file with the Guard's state, next to the sidecar."""
    blocked: bool = False
    """Renamed `<name>.poisoned` (`GuardConfig.block_poisoned_checkpoints`)."""
    saved_at: float = 0.0
    trainguard_version: str = ""
    format: int = FORMAT

    @property
    def poisoned(self) -> bool:
        return not self.weights_finite or self.optimizer_finite is False

    @property
    def status(self) -> CheckpointStatus:
        """`poisoned` when anything was non-finite, else the run's health at the save."""
        return "poisoned" if self.poisoned else self.health

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status}

    @classmethod
    def from_dict(cls, data: Any, where: Path) -> CheckpointHealth:
        """A sidecar's JSON, its types checked (a sidecar is read as untrusted input)."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise CheckpointError(f"{where} is not a trainguard checkpoint sidecar")
        try:
            optimizer = data.get("optimizer_finite")
            events = data.get("open_events") or []
            record = cls(
                step=_int(data["step"]),
                health=_choice(data["health"], ("healthy", "incident", "recovered")),
                weights_finite=_bool(data["weights_finite"]),
                optimizer_finite=None if optimizer is None else _bool(optimizer),
                policy=str(data["policy"]), verdict=_opt_str(data.get("verdict")),
                open_events=[dict(e) for e in events if isinstance(e, Mapping)]
                if isinstance(events, list) else [],
                fingerprint=_fingerprint(data.get("fingerprint") or {}),
                state_file=_opt_str(data.get("state_file")),
                blocked=_bool(data.get("blocked", False)),
                saved_at=float(data.get("saved_at", 0.0)),
                trainguard_version=str(data.get("trainguard_version", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{where} is a corrupt trainguard sidecar ({exc})") from None
        return record


@dataclass(slots=True)
class CheckpointEntry:
    """A checkpoint found on disk with what its sidecar says (`problem` when it says nothing
    usable about it)."""

    path: Path
    health: CheckpointHealth | None
    problem: str | None = None

    @property
    def status(self) -> CheckpointStatus | Literal["unreadable"]:
        if self.health is None:
            return "unreadable"
        if self.problem is not None:
            return "stale"
        return self.health.status

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "status": self.status, "problem": self.problem,
                "sidecar": self.health.to_dict() if self.health is not None else None}


# -- where the files are -------------------------------------------------------------------------
def sidecar_path(checkpoint: str | os.PathLike[str]) -> Path:
    """`trainguard.json` inside a checkpoint folder, `<file>.trainguard.json` next to a file."""
    path = Path(checkpoint)
    return path / SIDECAR if path.is_dir() else path.with_name(f"{path.name}.{SIDECAR}")


def state_path(checkpoint: str | os.PathLike[str]) -> Path:
    """The companion file with the Guard's state, beside the sidecar."""
    path = Path(checkpoint)
    return path / STATE_FILE if path.is_dir() else path.with_name(f"{path.name}.{STATE_FILE}")


def _own_file(name: str) -> bool:
    return name in (SIDECAR, STATE_FILE) or _own_temp(name)


def fingerprint(checkpoint: str | os.PathLike[str]) -> dict[str, list[int]]:
    """Each file of a checkpoint (a folder's files, trainguard's own left out) -> its size and
    modification time in nanoseconds."""
    path = Path(checkpoint)
    if path.is_file():
        info = path.stat()
        return {path.name: [info.st_size, info.st_mtime_ns]}
    prints: dict[str, list[int]] = {}
    for root, _, files in os.walk(path):
        for name in files:
            if not _own_file(name):
                file = Path(root) / name
                info = file.stat()
                prints[file.relative_to(path).as_posix()] = [info.st_size, info.st_mtime_ns]
    return prints


# -- writing -------------------------------------------------------------------------------------
def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON to a hidden temporary file beside `path`, flushed to disk, then rename it over
    `path`: a reader sees the old file or the whole new one, never half of it."""
    text = json.dumps(data, indent=1, allow_nan=False)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def clean_temps(directory: Path) -> None:
    """Remove the temporary files of sidecar and state writes that were killed half-way."""
    with contextlib.suppress(OSError):
        for item in directory.iterdir():
            if _own_temp(item.name):
                item.unlink(missing_ok=True)


def _own_temp(name: str) -> bool:
    return (name.startswith(".") and name.endswith(".tmp")
            and (f"{SIDECAR}." in name or f"{STATE_FILE}." in name))


def forget(checkpoint: str | os.PathLike[str]) -> None:
    """Remove a checkpoint's sidecar before it is described again: until the new one is
    written, the checkpoint has no health rather than an old one."""
    sidecar_path(checkpoint).unlink(missing_ok=True)


# -- reading -------------------------------------------------------------------------------------
def read_health(checkpoint: str | os.PathLike[str]) -> CheckpointEntry:
    """A checkpoint's sidecar, checked against the checkpoint's files. Raises `CheckpointError`
    when the sidecar is missing or not trainguard's."""
    path = Path(checkpoint)
    return _entry(path, sidecar_path(path))


def _entry(path: Path, sidecar: Path) -> CheckpointEntry:
    try:
        if sidecar.stat().st_size > MAX_SIDECAR_BYTES:
            raise CheckpointError(f"{sidecar} is too large to be a trainguard sidecar")
        data = json.loads(sidecar.read_text(encoding="utf-8"),
                          parse_constant=_no_constant)
    except FileNotFoundError:
        raise CheckpointError(f"{path} has no trainguard sidecar ({sidecar.name})") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{sidecar} is a corrupt trainguard sidecar "
                              f"({type(exc).__name__})") from None
    health = CheckpointHealth.from_dict(data, sidecar)
    problem = None
    if not path.exists():
        problem = "the checkpoint is gone"
    elif fingerprint(path) != health.fingerprint:
        problem = "the checkpoint was written again after this sidecar (it does not describe it)"
    return CheckpointEntry(path, health, problem)


def _sidecars(directory: Path, depth: int) -> Iterator[tuple[Path, Path]]:
    """(checkpoint, sidecar) pairs under `directory`, `depth` folders deep at most."""
    try:
        items = sorted(directory.iterdir())
    except OSError:
        return
    for item in items:
        if item.is_dir():
            if (item / SIDECAR).is_file():
                yield item, item / SIDECAR
            elif depth > 0:
                yield from _sidecars(item, depth - 1)
        elif item.name.endswith(f".{SIDECAR}") and not item.name.startswith("."):
            yield item.with_name(item.name[:-len(SIDECAR) - 1]), item


def list_checkpoints(output_dir: str | os.PathLike[str], *,
                     strict: bool = True) -> list[CheckpointEntry]:
    """Every checkpoint with a sidecar under `output_dir` (an HF output folder, a Lightning
    checkpoint folder, a checkpoint itself), oldest step first. `strict`: a corrupt sidecar is a
    `CheckpointError` naming it (otherwise listed as unreadable); no sidecar at all is one too."""
    root = Path(output_dir)
    if not root.exists():
        raise CheckpointError(f"{root} does not exist")
    pairs = ([(root, root / SIDECAR)] if (root / SIDECAR).is_file() else
             [(root, sidecar_path(root))] if root.is_file() else list(_sidecars(root, 3)))
    entries: list[CheckpointEntry] = []
    corrupt: list[str] = []
    for path, sidecar in pairs:
        try:
            entries.append(_entry(path, sidecar))
        except CheckpointError as exc:
            corrupt.append(str(exc))
            entries.append(CheckpointEntry(path, None, str(exc)))
    if strict and corrupt:
        more = f" (and {len(corrupt) - 1} more)" if len(corrupt) > 1 else ""
        raise CheckpointError(f"{corrupt[0]}{more}")
    if not entries:
        raise CheckpointError(f"no checkpoint under {root} has a trainguard sidecar "
                              f"({SIDECAR}); they are written by trainguard's callbacks and "
                              f"by trainguard.mark_checkpoint")
    return sorted(entries, key=lambda e: (e.health.step if e.health else -1,
                                          e.health.saved_at if e.health else 0.0))


def last_healthy_checkpoint(output_dir: str | os.PathLike[str]) -> Path | None:
    """The newest checkpoint under `output_dir` whose sidecar says healthy (or recovered after a
    rollback), finite, and still describes it; None when there is none. For
    `trainer.train(resume_from_checkpoint=...)` or `Trainer.fit(ckpt_path=...)`."""
    try:
        entries = list_checkpoints(output_dir, strict=False)
    except CheckpointError:
        return None
    good = [e for e in entries if e.status in RESUMABLE and not e.path.name.endswith(
        POISONED_SUFFIX)]
    return good[-1].path if good else None


# -- checks --------------------------------------------------------------------------------------
def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected a whole number, got {value!r}")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _choice(value: Any, allowed: tuple[str, ...]) -> Any:
    if value not in allowed:
        raise ValueError(f"unknown health {value!r}")
    return value


def _fingerprint(value: Any) -> dict[str, list[int]]:
    if not isinstance(value, Mapping):
        raise TypeError("the fingerprint is not a mapping")
    prints: dict[str, list[int]] = {}
    for name, pair in value.items():
        if (not isinstance(pair, list) or len(pair) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)):
            raise TypeError(f"bad fingerprint entry for {name!r}")
        prints[str(name)] = [int(pair[0]), int(pair[1])]
    return prints

