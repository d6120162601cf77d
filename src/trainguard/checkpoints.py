"""Checkpoint sidecars: what a checkpoint on disk knows of the run's health when it was saved.

Every checkpoint trainguard sees saved (the HF Trainer's `on_save`, Lightning's `ModelCheckpoint`,
a plain loop's `trainguard.mark_checkpoint(path, guard)`) gets a small JSON sidecar:

- an HF checkpoint folder: `checkpoint-30/trainguard.json`;
- a file (a Lightning `.ckpt`, a plain `torch.save`): `epoch=0-step=30.ckpt.trainguard.json`
  next to it.

It holds the step, the run's health at that step (`healthy`, `incident`: inside an incident,
`recovered`: after a rollback), whether every weight and optimizer moment was finite, the open
events, the verdict so far, and the checkpoint's content fingerprint
(`checkpoint_fingerprint.py`): a copy keeps its health, a checkpoint written again or changed in
place is `changed`, never described by the old sidecar. The Guard's own state goes to a companion
file (`trainguard_state.pt`, written by `checkpoint_health`). A sidecar is a few kilobytes
whatever the number of files, and is created with the permissions the umask gives, as the
checkpoint's own files are.

Reading never raises on what the file system holds: a sidecar is read only when it is a regular
file, within `MAX_SIDECAR_BYTES`; a folder that cannot be read, a dangling or looping symlink is
passed over; directory symlinks are followed once per folder (no loop, no checkpoint listed
twice); a checkpoint removed while it is read (a save's rotation) is left out.

This module reads and writes the JSON only and imports no torch, so `trainguard checkpoints`
starts fast; the finiteness check and the state file are in `checkpoint_health.py`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainguard.checkpoint_fingerprint import SCHEME, ContentFingerprint, differs, members, take
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
RESCANS = 3
"""Scans of a folder whose checkpoints were all removed while they were read (a rotation)."""

Health = Literal["healthy", "incident", "recovered"]
CheckpointStatus = Literal["healthy", "incident", "recovered", "poisoned", "changed", "stale"]
"""`changed`: the checkpoint's files are not those the sidecar describes (written again, or
changed in place); `stale`: the sidecar cannot be checked against them (the checkpoint is gone,
or a sidecar of an earlier version whose files' sizes and times no longer match)."""
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
    """Sidecars of earlier versions: each file (relative path) -> [size, mtime_ns] when marked
    (empty in new sidecars: a list that grows with the files)."""
    content: ContentFingerprint | None = None
    """The checkpoint's files when marked (`checkpoint_fingerprint.py`)."""
    state_file: str | None = None
    """The companion file with the Guard's state, next to the sidecar."""
    blocked: bool = False
    """Renamed `<name>.poisoned` (`GuardConfig.checkpoints.block_poisoned`)."""
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
            content = data.get("content")
            record = cls(
                step=_int(data["step"]),
                health=_choice(data["health"], ("healthy", "incident", "recovered")),
                weights_finite=_bool(data["weights_finite"]),
                optimizer_finite=None if optimizer is None else _bool(optimizer),
                policy=str(data["policy"]), verdict=_opt_str(data.get("verdict")),
                open_events=_events(data.get("open_events")),
                fingerprint=_fingerprint(data.get("fingerprint") or {}),
                content=None if content is None else ContentFingerprint.from_dict(content),
                state_file=_opt_str(data.get("state_file")),
                blocked=_bool(data.get("blocked", False)),
                saved_at=_finite(data.get("saved_at", 0.0)),
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
    drift: Literal["changed", "stale"] = "stale"
    """The status when `problem` says the sidecar does not describe the checkpoint."""

    @property
    def status(self) -> CheckpointStatus | Literal["unreadable"]:
        if self.health is None:
            return "unreadable"
        if self.problem is not None:
            return self.drift
        return self.health.status

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "status": self.status, "problem": self.problem,
                "sidecar": self.health.to_dict() if self.health is not None else None}


# -- where the files are -------------------------------------------------------------------------
def sidecar_path(checkpoint: str | os.PathLike[str]) -> Path:
    """`trainguard.json` inside a checkpoint folder, `<file>.trainguard.json` next to a file."""
    path = Path(checkpoint)
    return path / SIDECAR if _is_dir(path) else path.with_name(f"{path.name}.{SIDECAR}")


def state_path(checkpoint: str | os.PathLike[str]) -> Path:
    """The companion file with the Guard's state, beside the sidecar."""
    path = Path(checkpoint)
    return path / STATE_FILE if _is_dir(path) else path.with_name(f"{path.name}.{STATE_FILE}")


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):  # gone, a looping link, no permission on the way
        return False


def _lexists(path: Path) -> bool:
    try:
        os.lstat(path)
    except (OSError, ValueError):
        return False
    return True


def _own_file(name: str) -> bool:
    return name in (SIDECAR, STATE_FILE) or _own_temp(name)


def content_fingerprint(checkpoint: str | os.PathLike[str]) -> ContentFingerprint:
    """The fingerprint of a checkpoint's files (a folder's, trainguard's own left out) now."""
    return take(Path(checkpoint), _own_file)


def fingerprint(checkpoint: str | os.PathLike[str]) -> dict[str, list[int]] | None:
    """The fingerprint of earlier versions' sidecars: each file of a checkpoint -> its size and
    modification time in nanoseconds; None when a file cannot be read."""
    prints: dict[str, list[int]] = {}
    for name, file in members(Path(checkpoint), _own_file):
        try:
            info = os.stat(file)
        except OSError:
            return None
        prints[name] = [info.st_size, info.st_mtime_ns]
    return prints


# -- writing -------------------------------------------------------------------------------------
def open_temp(path: Path) -> tuple[int, Path]:
    """A new hidden temporary file beside `path` (`.<name>.<random>.tmp`), open for writing and
    created with the permissions the umask gives: `mkstemp`'s 0600 would keep the other users of
    a shared output folder from reading what trainguard wrote there."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON to a hidden temporary file beside `path`, flushed to disk, then rename it over
    `path`: a reader sees the old file or the whole new one, never half of it."""
    text = json.dumps(data, indent=1, allow_nan=False)
    fd, tmp = open_temp(path)
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


def read_sidecar_bytes(sidecar: Path, limit: int = MAX_SIDECAR_BYTES) -> bytes:
    """A sidecar's bytes: opened without blocking and read only when it is a regular file, at
    most `limit` bytes (a FIFO would hang the reader, a link to /dev/zero never ends)."""
    fd = os.open(sidecar, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(f"{sidecar} is not a regular file: not a trainguard sidecar")
        chunks: list[bytes] = []
        size = 0
        while size <= limit and (chunk := os.read(fd, min(1 << 16, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise CheckpointError(f"{sidecar} is too large to be a trainguard sidecar")
    return b"".join(chunks)


def _entry(path: Path, sidecar: Path) -> CheckpointEntry:
    try:
        data = json.loads(read_sidecar_bytes(sidecar).decode("utf-8"),
                          parse_constant=_no_constant)
    except FileNotFoundError:
        raise CheckpointError(f"{path} has no trainguard sidecar ({sidecar.name})") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{sidecar} is a corrupt trainguard sidecar "
                              f"({type(exc).__name__})") from None
    health = CheckpointHealth.from_dict(data, sidecar)
    problem: str | None = None
    drift: Literal["changed", "stale"] = "stale"
    if not _lexists(path):
        problem = "the checkpoint is gone"
    elif health.content is not None:
        problem = differs(path, health.content, _own_file)
        drift = "changed" if health.content.scheme == SCHEME else "stale"
    elif fingerprint(path) != health.fingerprint:  # an earlier version's sidecar: as then
        problem = "the checkpoint was written again after this sidecar (it does not describe it)"
    return CheckpointEntry(path, health, problem, drift)


def _sidecars(root: Path, depth: int) -> list[tuple[Path, Path]]:
    """(checkpoint, sidecar) pairs under `root`, `depth` folders deep at most. Each folder is
    read once, by its device and inode: the folders themselves first, then those reached only
    through a directory symlink (a symlink back up is a loop, and one to a checkpoint already
    found would list it twice)."""
    pairs: list[tuple[Path, Path]] = []
    seen: set[tuple[int, int]] = set()
    linked: list[tuple[Path, int]] = []

    def first_visit(folder: Path) -> bool:
        try:
            info = os.stat(folder)
        except (OSError, ValueError):
            return False
        key = (info.st_dev, info.st_ino)
        if key in seen:
            return False
        seen.add(key)
        return True

    def enter(folder: Path, depth: int) -> None:
        if _lexists(folder / SIDECAR):
            if first_visit(folder):
                pairs.append((folder, folder / SIDECAR))
        elif depth > 0 and first_visit(folder):
            visit(folder, depth - 1)

    def visit(folder: Path, depth: int) -> None:
        try:
            with os.scandir(folder) as found:
                items = sorted(found, key=lambda e: e.name)
        except (OSError, ValueError):  # no permission, gone meanwhile
            return
        for item in items:
            path = Path(item.path)
            try:
                is_dir, is_link = item.is_dir(), item.is_symlink()
            except OSError:
                continue
            if is_dir and is_link:
                linked.append((path, depth))
            elif is_dir:
                enter(path, depth)
            elif item.name.endswith(f".{SIDECAR}") and not item.name.startswith("."):
                pairs.append((path.with_name(item.name[:-len(SIDECAR) - 1]), path))

    first_visit(root)
    visit(root, depth)
    while linked:
        path, left = linked.pop(0)
        enter(path, left)
    return pairs


def list_checkpoints(output_dir: str | os.PathLike[str], *,
                     strict: bool = True) -> list[CheckpointEntry]:
    """Every checkpoint with a sidecar under `output_dir` (an HF output folder, a Lightning
    checkpoint folder, a checkpoint itself), oldest step first. `strict`: a corrupt sidecar is a
    `CheckpointError` naming it (otherwise listed as unreadable); no sidecar at all is one too.
    A checkpoint whose sidecar vanished while it was read (a save's rotation) is left out."""
    root = Path(output_dir)
    try:
        os.stat(root)
    except FileNotFoundError:
        raise CheckpointError(f"{root} does not exist") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {root} ({_reason(exc)})") from None
    entries: list[CheckpointEntry] = []
    corrupt: list[str] = []
    for _ in range(RESCANS):
        pairs = ([(root, root / SIDECAR)] if _lexists(root / SIDECAR) else
                 [(root, sidecar_path(root))] if not _is_dir(root) else _sidecars(root, 3))
        if not pairs and _is_dir(root):
            try:
                os.scandir(root).close()
            except OSError as exc:
                raise CheckpointError(f"cannot read {root} ({_reason(exc)})") from None
        entries, corrupt = _entries(pairs)
        if entries or not pairs:
            break  # else every checkpoint found was rotated away meanwhile: the newer ones
    if strict and corrupt:
        more = f" (and {len(corrupt) - 1} more)" if len(corrupt) > 1 else ""
        raise CheckpointError(f"{corrupt[0]}{more}")
    if not entries:
        raise CheckpointError(f"no checkpoint under {root} has a trainguard sidecar "
                              f"({SIDECAR}); they are written by trainguard's callbacks and "
                              f"by trainguard.mark_checkpoint")
    return sorted(entries, key=lambda e: (e.health.step if e.health else -1,
                                          e.health.saved_at if e.health else 0.0))


def _entries(pairs: list[tuple[Path, Path]]) -> tuple[list[CheckpointEntry], list[str]]:
    """The entries of (checkpoint, sidecar) pairs, and the errors of the corrupt ones; those
    whose sidecar is gone by the time it is read or checked are left out."""
    entries: list[CheckpointEntry] = []
    corrupt: list[str] = []
    for path, sidecar in pairs:
        try:
            entry = _entry(path, sidecar)
        except CheckpointError as exc:
            if not _lexists(sidecar):
                continue  # removed while it was listed
            corrupt.append(str(exc))
            entries.append(CheckpointEntry(path, None, str(exc)))
            continue
        if entry.problem is not None and not _lexists(sidecar):
            continue  # removed while it was checked
        entries.append(entry)
    return entries, corrupt


def last_healthy_checkpoint(output_dir: str | os.PathLike[str]) -> Path | None:
    """The newest checkpoint under `output_dir` whose sidecar says healthy (or recovered after a
    rollback), finite, and still describes it; None when there is none. For
    `trainer.train(resume_from_checkpoint=...)` or `Trainer.fit(ckpt_path=...)`."""
    try:
        entries = list_checkpoints(output_dir, strict=False)
    except CheckpointError:
        return None
    return newest_healthy(entries)


def newest_healthy(entries: list[CheckpointEntry]) -> Path | None:
    """The newest of `entries` (oldest first) to resume from."""
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


def _finite(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {value!r}")
    if not math.isfinite(value):  # 1e400 reads as inf: never shown, never sorted by
        raise ValueError(f"expected a finite number, got {value!r}")
    return float(value)


def _events(value: Any) -> list[dict[str, Any]]:
    """The open events' kind, step and severity (anything else left out: a sidecar's numbers are
    shown as JSON again, and a 1e400 there would be inf)."""
    if not isinstance(value, list):
        return []
    return [{"kind": e["kind"], "step": e["step"], "severity": e["severity"]}
            for e in value[:100] if isinstance(e, Mapping)
            and isinstance(e.get("kind"), str) and isinstance(e.get("severity"), str)
            and isinstance(e.get("step"), int) and not isinstance(e.get("step"), bool)]


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or type(exc).__name__


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

