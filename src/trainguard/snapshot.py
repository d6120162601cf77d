"""Crash snapshots: everything needed to replay the step that went bad.

A snapshot holds the model, optimizer, scheduler and scaler states as they were *before* the bad
update, the RNG states, the step, the offending batch when known, the events and the config. It is
written atomically (temporary file, fsync, rename) and only holds types that
`torch.load(weights_only=True)` accepts.

`load_snapshot` reads a file as untrusted input. `torch.save` writes a zip archive whose entries
are stored, not compressed, so loading one takes about its size in memory, however large the
model. A compressed entry can inflate about a thousandfold (a 4 MB file to 4 GB), so before
`torch.load` the archive's directory is read: the compressed entries may inflate to at most
`max_inflated` bytes (1 GiB by default) more than they take in the file, and each one is inflated
in chunks, without keeping the output, to check that it holds no more than it declares.

A process killed while it writes one leaves its hidden temporary file (`.crash_step12.pt.<pid>.
<host>.<random>.tmp`, as large as the snapshot) behind. `clean_stale_temps` removes those of
processes that are gone; the Guard runs it when it starts and before every snapshot it writes.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import struct
import tempfile
import time
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from trainguard.errors import SnapshotError
from trainguard.rng import process_state

FORMAT_VERSION = 1
REQUIRED_KEYS = ("format", "step", "model", "optimizer", "rng", "events")
GiB = 1 << 30
MAX_INFLATED = GiB
"""How much more than the file holds its compressed entries may inflate to, by default.
trainguard's own snapshots have no compressed entries, so this limits foreign files only."""
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")
_CHUNK = 1 << 20

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


def build_snapshot(*, step: int, model: nn.Module, optimizers: list[torch.optim.Optimizer],
                   scheduler: Any = None, scaler: Any = None, batch: Any = None,
                   events: list[dict[str, Any]] | None = None,
                   config: dict[str, Any] | None = None,
                   extra: dict[str, Any] | None = None,
                   forward_rng: tuple[torch.Tensor, list[torch.Tensor] | None] | None = None,
                   ) -> dict[str, Any]:
    """`forward_rng`: the RNG state the step's forward started from (`diagnose/step_rng.py`),
    stored as the snapshot's torch (and CUDA) RNG so a replay draws the step's dropout masks;
    None: the RNG as it is now."""
    rng = process_state()
    if forward_rng is not None:
        rng["torch"] = forward_rng[0]
        if forward_rng[1] is not None:
            rng["cuda"] = forward_rng[1]
    snap: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizers[0].state_dict() if len(optimizers) == 1
        else [o.state_dict() for o in optimizers],
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": rng,
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


def load_snapshot(path: str | os.PathLike[str], *,
                  max_inflated: int | None = None) -> dict[str, Any]:
    """Load a crash snapshot safely (weights_only=True); one clear `SnapshotError` when it is
    missing, empty, truncated, corrupt, not a snapshot, or has the wrong structure, and when its
    compressed entries would inflate to more than `max_inflated` bytes beyond what they take in
    the file (a decompression bomb; trainguard's own snapshots are not compressed). None:
    `MAX_INFLATED`, 1 GiB."""
    source = Path(path)
    if not source.is_file():
        raise SnapshotError(f"no snapshot at {source}")
    try:
        if source.stat().st_size == 0:
            raise SnapshotError(f"{source} is empty, not a trainguard snapshot")
        check_archive(source, MAX_INFLATED if max_inflated is None else max_inflated)
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


def check_archive(source: Path, max_inflated: int) -> None:
    """Raise a SnapshotError when the zip archive `torch.load` would read inflates to more than
    `max_inflated` bytes beyond its compressed size, or when an entry holds more or less than
    its directory declares. A file that is no zip archive (torch's legacy format) passes: it is
    read as it lies on disk."""
    with source.open("rb") as handle:
        if handle.read(4) != b"PK\x03\x04":
            return  # what torch.load takes for its legacy format: nothing inflates there
        try:
            entries = zipfile.ZipFile(handle).infolist()
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
            raise SnapshotError(f"{source} is not a readable trainguard snapshot (a damaged zip "
                                f"archive; {_short(exc)})") from None
        size = source.stat().st_size
        packed = [e for e in entries if e.compress_type != zipfile.ZIP_STORED]
        for entry in entries:
            if entry.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise SnapshotError(f"{source} is not a readable trainguard snapshot: its entry "
                                    f"{entry.filename!r} uses compression method "
                                    f"{entry.compress_type}, which torch cannot read")
            if entry.compress_type == zipfile.ZIP_STORED and entry.file_size != entry.compress_size:
                raise _lies(source, entry, f"{entry.compress_size:,} stored bytes")
            if entry.header_offset + entry.compress_size > size:
                raise SnapshotError(f"{source} is not a readable trainguard snapshot (truncated: "
                                    f"its entry {entry.filename!r} runs past the end of the file)")
        inflated = sum(e.file_size for e in packed)
        compressed = sum(e.compress_size for e in packed)
        if inflated - compressed > max_inflated:
            raise SnapshotError(
                f"{source} is refused: its compressed entries would inflate to "
                f"{_bytes(inflated)} from {_bytes(compressed)}, more than the "
                f"{_bytes(max_inflated)} beyond their size in the file that trainguard allows (its "
                f"own snapshots are not compressed; load_snapshot(path, max_inflated=...) raises "
                f"the limit)")
        for entry in packed:
            actual = _inflated_size(handle, entry)
            if actual < 0:
                raise SnapshotError(f"{source} is not a readable trainguard snapshot: its entry "
                                    f"{entry.filename!r} is not a whole deflate stream (a "
                                    f"damaged or crafted archive)")
            if actual != entry.file_size:
                shown = f"more than {entry.file_size:,}" if actual > entry.file_size else (
                    f"{actual:,}")
                raise _lies(source, entry, f"{shown} bytes when inflated")


def _inflated_size(handle: Any, entry: zipfile.ZipInfo) -> int:
    """How many bytes a deflated entry inflates to, counted in chunks and never kept; counting
    stops once past its declared size. -1 when the data is not a whole deflate stream."""
    handle.seek(entry.header_offset)
    header = handle.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
        return -1
    fields = _LOCAL_HEADER.unpack(header)
    handle.seek(entry.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1])
    inflater = zlib.decompressobj(-15)
    left, total = entry.compress_size, 0
    try:
        while not inflater.eof and total <= entry.file_size:
            chunk = inflater.unconsumed_tail
            if not chunk and left > 0:
                chunk = handle.read(min(left, _CHUNK))
                if not chunk:
                    return -1
                left -= len(chunk)
            out = len(inflater.decompress(chunk, _CHUNK))  # an empty chunk flushes what is due
            total += out
            if not out and not chunk:
                return -1  # the data ended before the deflate stream did
    except zlib.error:
        return -1
    return total


def _lies(source: Path, entry: zipfile.ZipInfo, holds: str) -> SnapshotError:
    return SnapshotError(f"{source} is not a readable trainguard snapshot: its entry "
                         f"{entry.filename!r} declares {entry.file_size:,} bytes but holds "
                         f"{holds} (a damaged or crafted archive)")


def _bytes(count: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


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
