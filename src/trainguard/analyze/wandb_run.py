"""Weights & Biases runs on disk: the history a run logged, from the run's own records.

A W&B run directory (`wandb/offline-run-<time>-<id>/`, `wandb/run-<time>-<id>/`) keeps every
`run.log` call as a history record of its transaction log, `run-<id>.wandb`, offline or not. That
log is read here record by record: its framing is the LevelDB log format (blocks of 32 KiB,
records cut into pieces, each with a 7-byte header), its records are wandb's own protobuf
messages, decoded with wandb's definitions (`wandb.proto`), imported only when such a log is read.
A run fetched from the W&B server may hold its history as `files/wandb-history.jsonl` instead (one
JSON object per record), which needs no wandb. Without either, the message says what to install.

Given the `wandb/` folder a script writes into, the run its `latest-run` link names is read
(else the newest by the time in its name), and a note names it; `run_id` picks another by its id.

Steps are the tracker's step axis: the first of `train/global_step` (the HF Trainer's
`WandbCallback`), `trainer/global_step` (Lightning's `WandbLogger`), `global_step` and `step` that
the first history record holds, else W&B's own counter `_step` (a plain loop's `run.log`). W&B
keeps a NaN or inf as a value (`"NaN"`, `"Infinity"` in the record's JSON): it stays one.
Lightning's epoch aggregates beside its step values are left out as in a `metrics.csv`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeGuard

from trainguard.analyze.lightning import epoch_aggregates
from trainguard.analyze.log import Log, LogBuilder, LogError
from trainguard.analyze.source import MAX_RECORD, Lines, open_regular

FORMAT = "wandb"
STEP_KEYS = ("train/global_step", "trainer/global_step", "global_step", "step")
"""The step axes trackers' integrations log, before W&B's own `_step`."""
OWN_STEP = "_step"
HISTORY_JSONL = "files/wandb-history.jsonl"
MAGIC = b":W&B"
_BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def is_log_file(path: Path) -> bool:
    return path.suffix == ".wandb" and path.is_file()


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and (_log_files(path) != [] or (path / HISTORY_JSONL).is_file())


def run_dirs(path: Path) -> list[Path]:
    """The run directories a `wandb/` folder holds (or the folder that holds `wandb/`)."""
    for folder in (path, path / "wandb"):
        if folder.is_dir():
            found = [p for p in folder.iterdir()
                     if p.name.startswith(("run-", "offline-run-")) and is_run_dir(p)]
            if found:
                return sorted(found, key=_started)
    return []


def is_wandb(path: Path) -> bool:
    """Whether `path` is a W&B run: its `.wandb` file, its directory, or a folder of runs."""
    if path.is_file():
        return is_log_file(path)
    return is_run_dir(path) or bool(run_dirs(path))


def read(path: str | Path, run_id: str | None = None) -> Log:
    path = Path(path)
    notes: list[str] = []
    run = path if path.is_file() or is_run_dir(path) else _choose_run(path, run_id, notes)
    if run_id is not None and run is path and _run_id(path) != run_id:
        raise LogError(f"{path}: holds W&B run {_run_id(path)}, not {run_id}")
    log = LogBuilder(run, FORMAT)
    log.notes.extend(notes)
    _Steps(log).add_all(_records(run, log.notes))
    return log.build(what="training values (no history record with a numeric metric)")


def _records(run: Path, notes: list[str]) -> Iterator[dict[str, Any]]:
    """The history records of a run, each as {name: value}."""
    files = [run] if run.is_file() else _log_files(run)
    history = None if run.is_file() else run / HISTORY_JSONL
    if files and (_wandb_importable() or history is None or not history.is_file()):
        if not _wandb_importable():
            raise LogError(f"{files[0]}: a W&B run log; reading it needs wandb (pip install "
                           "wandb)")
        if len(files) > 1:
            notes.append(f"{len(files)} .wandb logs in the run directory (the run was resumed); "
                         "read in turn")
        for file in files:
            yield from _log_records(file, notes)
        return
    if history is not None and history.is_file():
        yield from _jsonl_records(history, notes)
        return
    raise LogError(f"{run}: no W&B history in it (no run-<id>.wandb, no {HISTORY_JSONL})")


def _wandb_importable() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("wandb") is not None
    except (ImportError, ValueError):
        return False


def _log_records(file: Path, notes: list[str]) -> Iterator[dict[str, Any]]:
    """The history records of a `.wandb` transaction log, read a block at a time."""
    from wandb.proto import wandb_internal_pb2

    proto: Any = wandb_internal_pb2  # generated code: no types for its messages
    pieces: list[bytes] = []
    for kind, piece in _pieces(file, notes):
        if kind in (_FULL, _FIRST):
            pieces = [piece]
        elif pieces:
            pieces.append(piece)
        if kind not in (_FULL, _LAST) or not pieces:
            continue
        record = proto.Record()
        whole, pieces = b"".join(pieces), []
        try:
            record.ParseFromString(whole)
        except Exception:  # protobuf's DecodeError: a record of a newer wandb, or damaged
            notes.append(f"a record of {file.name} cannot be decoded; it is left out")
            continue
        if record.WhichOneof("record_type") == "history":
            yield {_item_name(item): _item_value(item) for item in record.history.item}
    if pieces and not any(_CUT.format(name=file.name) == note for note in notes):
        notes.append(_CUT.format(name=file.name))  # its first pieces, and no more


_CUT = "the last record of {name} is cut short (the run was still writing); it is left out"


def _pieces(file: Path, notes: list[str]) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each physical record, in order (none crosses a block); a record cut
    short at the end (a run still writing) is left out with a note."""
    with open_regular(file) as handle:
        block = handle.read(_BLOCK)
        if not block.startswith(MAGIC):
            raise LogError(f"{file}: not a W&B run log (it does not begin with "
                           f"{MAGIC.decode()})")
        at, base = _HEADER, 0  # past the file's own header: magic, version
        while block:
            # a block's tail too short for a header, or zeros, is padding
            while at + _HEADER <= len(block):
                _, length, kind = struct.unpack_from("<IHB", block, at)
                if kind == 0 and length == 0:
                    break
                end = at + _HEADER + length
                if end > len(block):
                    notes.append(_CUT.format(name=file.name))
                    return
                if kind not in (_FULL, _FIRST, _MIDDLE, _LAST):
                    raise LogError(f"{file}: a record of unknown type {kind} at byte "
                                   f"{base + at} (a damaged W&B run log)")
                yield kind, block[at + _HEADER:end]
                at = end
            if len(block) < _BLOCK:  # the last block: a header cut off is what is left
                if any(block[at:]):
                    notes.append(_CUT.format(name=file.name))
                return
            block, at, base = handle.read(_BLOCK), 0, base + _BLOCK


def _item_name(item: Any) -> str:
    return item.key or ".".join(item.nested_key)


def _item_value(item: Any) -> Any:
    """A history item's value: its JSON text (NaN and inf written as `NaN`, `Infinity`, which
    `json` reads back as such), or the typed value a newer wandb writes instead."""
    if item.value_json:
        try:
            return json.loads(item.value_json)
        except ValueError:
            return None
    typed = item.WhichOneof("value") if item.DESCRIPTOR.oneofs_by_name.get("value") else None
    return getattr(item, typed) if typed in ("number", "integer") else None


def _jsonl_records(file: Path, notes: list[str]) -> Iterator[dict[str, Any]]:
    lines = Lines(file, errors="strict", skip_long=False, max_line=MAX_RECORD)
    held: tuple[int, str] | None = None  # a line that does not parse is a cut only when last
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if held is not None:
            raise LogError(f"{file}: line {held[0]} is not valid JSON ({held[1]})")
        try:
            record = json.loads(line)
        except ValueError as exc:
            held = (number, str(exc))
            continue
        if isinstance(record, dict):
            yield record
    if held is not None:
        if lines.ended:
            raise LogError(f"{file}: line {held[0]} is not valid JSON ({held[1]})")
        notes.append(f"the last line ({held[0]}) is cut short (the file was being written); "
                     "it is left out")


class _Steps:
    """History records into rows, at the step of the axis the first record names."""

    def __init__(self, log: LogBuilder) -> None:
        self.log = log
        self.axis: str | None = None
        self.last: int | None = None
        self.without = 0
        self.names: set[str] = set()
        self.aggregates: set[str] = set()

    def add_all(self, records: Iterator[dict[str, Any]]) -> None:
        for record in records:
            self.add(record)
        if self.without:
            self.log.notes.append(f"{self.without} history record(s) without {self.axis} are "
                                  "read at the step of the record before them")

    def add(self, record: dict[str, Any]) -> None:
        if self.axis is None:
            self.axis = next((k for k in STEP_KEYS if _whole(record.get(k))), OWN_STEP)
        step = record.get(self.axis)
        if _whole(step):
            self.last = int(step)
        elif self.last is not None:
            self.without += 1
        else:
            own = record.get(OWN_STEP)
            self.last = int(own) if _whole(own) else 0
            self.without += 1
        if not record.keys() <= self.names:  # new names: Lightning's aggregates again
            self.names |= record.keys()
            self.aggregates = epoch_aggregates(self.names) | {self.axis}
        self.log.add_entry(self.last, {k: v for k, v in record.items()
                                       if k not in self.aggregates})


def _whole(value: Any) -> TypeGuard[int | float]:
    return (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer())


def _log_files(run: Path) -> list[Path]:
    return sorted(p for p in run.glob("*.wandb") if p.is_file())


def _started(run: Path) -> str:
    """A run directory's start, as its name writes it (`offline-run-20250101_120000-<id>`)."""
    return run.name.removeprefix("offline-").removeprefix("run-")


def _run_id(run: Path) -> str:
    if run.is_file():
        return run.stem.removeprefix("run-")
    return run.name.rsplit("-", 1)[-1]


def _choose_run(folder: Path, run_id: str | None, notes: list[str]) -> Path:
    runs = run_dirs(folder)
    if not runs:
        raise LogError(f"{folder}: no W&B run in this directory (no run-<id>.wandb, no "
                       f"{HISTORY_JSONL}, no offline-run-*/ or run-*/ folder)")
    if run_id is not None:
        chosen = [r for r in runs if _run_id(r) == run_id]
        if not chosen:
            ids = ", ".join(_run_id(r) for r in runs[-6:])
            raise LogError(f"{folder}: no W&B run {run_id!r} in it (its runs: {ids})")
        return chosen[-1]
    if len(runs) == 1:
        return runs[0]
    run = _latest_link(runs[0].parent) or runs[-1]
    notes.append(f"{len(runs)} W&B runs in this folder; read the latest, {run.name} (--run-id "
                 "picks another)")
    return run


def _latest_link(folder: Path) -> Path | None:
    """The run `wandb/latest-run` points to: the one the last script started."""
    link = folder / "latest-run"
    try:
        target = link.resolve() if link.is_symlink() else None
    except OSError:
        return None
    return target if target is not None and is_run_dir(target) else None
