"""Crash snapshots: everything needed to replay the step that went bad.

A snapshot holds the model, optimizer, scheduler and scaler states as they were *before* the bad
update, the RNG states, the step, the offending batch when known, the events and the config. It is
written atomically (temporary file, fsync, rename) and only holds types that
`torch.load(weights_only=True)` accepts.

A process killed while it writes one leaves its hidden temporary file (`.crash_step12.pt.<pid>.
<host>.<random>.tmp`, as large as the snapshot) behind. `clean_stale_temps` removes those of
processes that are gone; the Guard runs it when it starts and before every snapshot it writes.
"""

from __future__ import annotations

import logging
import os
import random
import re
import socket
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from trainguard.errors import SnapshotError

FORMAT_VERSION = 1
REQUIRED_KEYS = ("format", "step", "model", "optimizer", "rng", "events")
STALE_AFTER_S = 3600.0
"""A temporary snapshot whose writer cannot be checked (another host, or a name from before the
writer's pid was in it) is left alone until it has not changed for this long."""
log = logging.getLogger("trainguard")
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.(?P<host>[A-Za-z0-9-]+)\.\w+\.tmp$")
_LEGACY_TEMP = re.compile(r"^\.crash_step\d+(_rank\d+)?\.pt\.\w+\.tmp$")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40] or "host"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, owned by someone else
        return True
    return True


def clean_stale_temps(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary snapshot files in `directory` that a killed process left behind:
    those of a process of this host that is gone, and, when the writer cannot be checked, those
    unchanged for `STALE_AFTER_S`. Returns what was removed; never raises."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    host, now = _host(), time.time()
    for entry in entries:
        match = _TEMP.match(entry.name)
        try:
            if match is not None and match["host"] == host:
                stale = int(match["pid"]) != os.getpid() and not _pid_alive(int(match["pid"]))
            elif match is not None or _LEGACY_TEMP.match(entry.name):
                stale = now - entry.stat(follow_symlinks=False).st_mtime > STALE_AFTER_S
            else:
                continue
            if stale and entry.is_file(follow_symlinks=False):
                size = entry.stat(follow_symlinks=False).st_size
                os.unlink(entry.path)
                removed.append(Path(entry.path))
                log.info("trainguard: removed %s (%.0f MB), a snapshot left half written by a "
                         "process that was killed", entry.path, size / 1e6)
        except OSError:  # gone meanwhile, or not ours to remove
            continue
    return removed


def portable(value: Any) -> Any:
    """Convert a value to what `torch.load(weights_only=True)` can read; tensors go to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if value is None or type(value) in (bool, int, float, str, bytes):
        return value
    for plain in (bool, int, float, str, bytes):  # subclasses (TorchVersion, IntEnum) -> plain
        if isinstance(value, plain):
            return plain(value)  # type: ignore[arg-type]  # value is an instance of plain
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.array(value))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {(k if isinstance(k, (str, int, float, bool)) else repr(k)): portable(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        converted = [portable(v) for v in value]
        return converted if isinstance(value, list) else tuple(converted)
    if hasattr(value, "items") and callable(value.items):  # BatchEncoding and friends
        return {str(k): portable(v) for k, v in value.items()}
    return repr(value)


def rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    np_state: Any = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": (version, tuple(internal), gauss),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def build_snapshot(*, step: int, model: nn.Module, optimizers: list[torch.optim.Optimizer],
                   scheduler: Any = None, scaler: Any = None, batch: Any = None,
                   events: list[dict[str, Any]] | None = None,
                   config: dict[str, Any] | None = None,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    snap: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizers[0].state_dict() if len(optimizers) == 1
        else [o.state_dict() for o in optimizers],
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": rng_state(),
        "batch": batch,
        "events": events or [],
        "config": config or {},
        "torch_version": torch.__version__,
    }
    if extra:
        snap.update(extra)
    return portable(snap)


def write_snapshot(path: str | os.PathLike[str], snapshot: dict[str, Any]) -> Path:
    """Write atomically: readers see either no file or the whole snapshot."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(target.parent)  # room for this one: the leftovers of killed writers go
    # the pid and host in the name tell a later process whether the writer is gone
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.{_host()}.",
                               suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(snapshot, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the rename is still atomic
    return target


def load_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a crash snapshot safely (weights_only=True); one clear `SnapshotError` when it is
    missing, empty, truncated, corrupt, not a snapshot, or has the wrong structure."""
    source = Path(path)
    if not source.is_file():
        raise SnapshotError(f"no snapshot at {source}")
    try:
        if source.stat().st_size == 0:
            raise SnapshotError(f"{source} is empty, not a trainguard snapshot")
        snap = torch.load(source, map_location="cpu", weights_only=True)
    except SnapshotError:
        raise
    except Exception as exc:  # any unreadable file (pickle, zip, memo errors) is one message
        reason = _short(exc)
        raise SnapshotError(f"{source} is not a readable trainguard snapshot (truncated, corrupt "
                            f"or another kind of file; {reason})") from None
    if not isinstance(snap, dict):
        raise SnapshotError(f"{source} is not a trainguard snapshot (it holds a "
                            f"{type(snap).__name__}, not a snapshot)")
    missing = [key for key in REQUIRED_KEYS if key not in snap]
    if missing:
        raise SnapshotError(f"{source} is not a trainguard snapshot (missing keys: "
                            f"{', '.join(missing)})")
    if not _is_int(snap["format"]):
        raise _wrong(source, "format", snap["format"], "a version number")
    if snap["format"] != FORMAT_VERSION:
        raise SnapshotError(f"{source} has snapshot format {snap['format']}, this trainguard "
                            f"reads format {FORMAT_VERSION}")
    check_structure(snap, source)
    return snap


def _short(exc: BaseException) -> str:
    """The exception's first sentence, for a one-line message."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    first = text.splitlines()[0].split(". ")[0]
    return f"{type(exc).__name__}: {first if len(first) <= 160 else first[:157] + '...'}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _wrong(source: Path, what: str, value: Any, expected: str) -> SnapshotError:
    return SnapshotError(f"{source} is not a usable trainguard snapshot: its {what} is a "
                         f"{type(value).__name__}, expected {expected}")


def check_structure(snap: dict[str, Any], source: Path) -> None:
    """Raise a SnapshotError unless every part replay uses has the type it expects."""
    if not _is_int(snap["step"]) or snap["step"] < 0:
        raise _wrong(source, "step", snap["step"], "a step number")
    model = snap["model"]
    if not isinstance(model, Mapping) or not all(isinstance(k, str) for k in model):
        raise _wrong(source, "model", model, "a state_dict (names to tensors)")
    optimizer = snap["optimizer"]
    if not (isinstance(optimizer, Mapping) or (isinstance(optimizer, list) and optimizer and all(
            isinstance(o, Mapping) for o in optimizer))):
        raise _wrong(source, "optimizer", optimizer, "an optimizer state_dict")
    if not isinstance(snap["events"], list):
        raise _wrong(source, "events", snap["events"], "a list")
    for key in ("config", "scheduler", "scaler"):
        value = snap.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise _wrong(source, key, value, "a dict")
    _check_rng(snap["rng"], source)


def _check_rng(rng: Any, source: Path) -> None:
    if not isinstance(rng, Mapping):
        raise _wrong(source, "rng", rng, "a dict of RNG states")
    state = rng.get("torch")
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.dim() != 1:
        raise _wrong(source, "torch RNG state", state, "a uint8 tensor")
    python = rng.get("python")
    if not (isinstance(python, (tuple, list)) and len(python) == 3 and _is_int(python[0])
            and isinstance(python[1], (tuple, list)) and all(_is_int(x) for x in python[1])
            and (python[2] is None or isinstance(python[2], float))):
        raise _wrong(source, "python RNG state", python, "(version, state, gauss)")
    numpy_state = rng.get("numpy")
    if not (isinstance(numpy_state, Mapping) and isinstance(numpy_state.get("keys"), torch.Tensor)
            and numpy_state["keys"].numel() == 624 and _is_int(numpy_state.get("pos"))
            and _is_int(numpy_state.get("has_gauss"))
            and isinstance(numpy_state.get("cached_gaussian"), float)):
        raise _wrong(source, "numpy RNG state", numpy_state, "keys, pos, has_gauss and "
                     "cached_gaussian")
    cuda = rng.get("cuda")
    if cuda is not None and not (isinstance(cuda, (list, tuple))
                                 and all(isinstance(t, torch.Tensor) for t in cuda)):
        raise _wrong(source, "CUDA RNG state", cuda, "a list of tensors")
