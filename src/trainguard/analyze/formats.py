"""Which reader reads a path: by what it is and what it starts with, unless told (`--format`).

    a directory       a trainguard run directory (it holds trainguard.db) -> store;
                      TensorBoard event files in it (or below) -> tensorboard;
                      a trainer_state.json (in it, else in its latest checkpoint-N/) -> hf;
                      a metrics.csv (in it, else in its latest version_N/) -> lightning;
                      a W&B run directory, or a wandb/ folder of runs (or one holding it) ->
                      wandb; an MLflow store (mlflow.db, mlruns/, a run of it) -> mlflow
    a file            trainguard.db -> store; an SQLite file with MLflow's tables -> mlflow,
                      another -> store; a `.wandb` run log -> wandb; a name with `tfevents` ->
                      tensorboard;
                      JSON holding `log_history` -> hf; JSON objects, one per line -> jsonl
                      (also under a `.json` name: MMEngine's `*.log.json`); one JSON object
                      of values by metric or by step (Megatron-LM's golden values) ->
                      json-series
                      (Python dicts, one per line, as the HF Trainer prints them -> text;
                      a dict of lists, Keras's `History.history` printed or saved -> text);
                      TensorBoard's `Wall time,Step,Value` -> tensorboard-csv; W&B's
                      `"Step","<run> - <metric>",...` -> wandb-csv;
                      a CSV header beginning with `epoch`, without `step` -> keras;
                      a `#{...}` line over `r,l,t` (Gym's and Stable-Baselines3's `Monitor`)
                      -> monitor; `epoch,step,value` lines with no header, a file per
                      metric named after it (d3rlpy's `critic_loss.csv`) -> metric-csv;
                      a CSV header with a `step` column -> lightning; another `.csv` ->
                      text:table (its header's names); anything else -> text
    a tracking URI    sqlite:///... or file:///... -> mlflow (a server's URI is refused)

`run_id` picks a run of a store of several (`--run-id`): of a W&B folder or an MLflow store.
"""

from __future__ import annotations

import gc
import re
import stat
from collections.abc import Callable
from pathlib import Path

from trainguard.analyze import (
    exported,
    hf,
    json_series,
    jsonl,
    keras,
    lightning,
    metric_csv,
    mlflow_run,
    monitor,
    source,
    store,
    tensorboard,
    text,
    wandb_run,
)
from trainguard.analyze.format_names import FORMATS
from trainguard.analyze.log import Log, LogError

_READERS: dict[str, Callable[[Path], Log]] = {
    "hf": hf.read, "lightning": lightning.read, "tensorboard": tensorboard.read,
    "store": store.read, "jsonl": jsonl.read, "text": text.read, "keras": keras.read,
    "tensorboard-csv": exported.read, "wandb-csv": exported.read, "monitor": monitor.read,
    "metric-csv": metric_csv.read, "json-series": json_series.read,
}
_RUN_READERS: dict[str, Callable[[Path, str | None], Log]] = {
    "wandb": wandb_run.read, "mlflow": mlflow_run.read,
}
"""Readers of stores that hold several runs, one of them chosen by `run_id`."""
_SQLITE = b"SQLite format 3\0"
_HISTORY = re.compile(rb"""\{\s*(["'])[^"'\n]{1,120}\1\s*:\s*\[""")
"""A dict whose first value is a list (`{"loss": [0.69, ...`): one list per metric, as Keras's
`History.history` holds them (`analyze/history.py`); no other log opens so."""


def read_log(path: str | Path, fmt: str | None = None, run_id: str | None = None) -> Log:
    """Read a training log, its format detected unless `fmt` names one of `FORMATS`; `run_id`
    picks a run of a store that holds several (W&B, MLflow)."""
    local = mlflow_run.local_store(str(path)) if isinstance(path, str) else None
    if local is not None:  # a tracking URI names an MLflow store
        if fmt not in (None, "mlflow"):
            raise LogError(f"{path}: a tracking URI is read as --format mlflow, not {fmt}")
        path, fmt = local, "mlflow"
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError as exc:  # missing, a symlink loop, no permission: say which
        why = exc.strerror or "cannot be read"
        raise LogError(f"{path}: {why[:1].lower()}{why[1:]}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # a FIFO would block the reader
        raise LogError(f"{path}: not a regular file or directory (a pipe, socket or device); "
                       "to read standard input, give - as the path")
    if fmt is not None and fmt not in FORMATS:
        raise LogError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    name = fmt or detect_format(path)
    if run_id is not None and name not in _RUN_READERS:
        raise LogError(f"{path}: --run-id picks a run of a W&B folder or an MLflow store; this "
                       f"is read as {name}")
    # a reader makes a few objects per logged value and no cycles: the cyclic collector,
    # scanning them again and again as they pile up, would cost more than the reading
    collecting = gc.isenabled()
    gc.disable()
    try:
        if name.startswith("text:"):
            return text.read(_file(path, name), grammar=name.split(":", 1)[1])
        if name in _RUN_READERS:
            return _RUN_READERS[name](path, run_id)
        target = path if name in ("tensorboard", "store") else _file(path, name)
        return _READERS[name](target)
    finally:
        if collecting:
            gc.enable()


def _file(path: Path, fmt: str) -> Path:
    """The file a directory stands for under a file format."""
    if path.is_file():
        return path
    found = {"hf": _latest(path, "trainer_state.json", "checkpoint-"),
             "lightning": _latest(path, "metrics.csv", "version_")}.get(fmt)
    if found is None:
        what = FORMATS.get(fmt.split(":", 1)[0], fmt)
        raise LogError(f"{path}: a directory; --format {fmt} reads a file: give the {what} "
                       "file itself")
    return found


def _latest(path: Path, name: str, prefix: str) -> Path | None:
    """The log file of a folder, whatever it is: a pipe or a device under its name is found,
    and then refused by the reader with its name (`source.open_regular`)."""
    if (path / name).exists():
        return path / name
    numbered = [(int(m.group(1)), p) for p in path.glob(f"{prefix}*/{name}")
                if (m := re.fullmatch(rf"{re.escape(prefix)}(\d+)", p.parent.name))]
    return max(numbered)[1] if numbered else None


def detect_format(path: Path) -> str:
    if path.is_dir():
        if store.is_store(path):
            return "store"
        if any(tensorboard.is_event_file(p) for p in path.rglob("*tfevents*")):
            return "tensorboard"
        if _latest(path, "trainer_state.json", "checkpoint-") is not None:
            return "hf"
        if _latest(path, "metrics.csv", "version_") is not None:
            return "lightning"
        if wandb_run.is_wandb(path):
            return "wandb"
        if mlflow_run.is_mlflow(path):
            return "mlflow"
        raise LogError(f"{path}: no training log in this directory (looked for a trainguard "
                       "store, TensorBoard event files, trainer_state.json, metrics.csv, a W&B "
                       "run, an MLflow store)")
    if store.is_store(path):
        return "store"
    if wandb_run.is_log_file(path):
        return "wandb"
    if tensorboard.is_event_file(path):
        return "tensorboard"
    head = source.head(path)
    if head.startswith(_SQLITE):
        return "mlflow" if mlflow_run.is_db(path) else "store"
    if not head.strip():
        raise LogError(f"{path}: the file is empty")
    start = head.lstrip()
    if path.suffix == ".jsonl":
        return "jsonl"
    if start.startswith(b"{"):
        first_line = start.split(b"\n", 1)[0].strip()
        if b'"log_history"' not in head and _is_json(first_line) and \
                start.split(b"\n", 2)[1:2] and start.split(b"\n", 2)[1].lstrip()[:1] == b"{":
            return "jsonl"  # one object a line, whatever the name (MMEngine's `*.log.json`)
        if re.match(rb"\{\s*'", first_line) and path.suffix != ".json":
            return "text"  # a Python dict printed (single quotes, never JSON's): pasted
        if _HISTORY.match(start) and b'"log_history"' not in head:
            return "text"  # a dict of lists: Keras's `History.history`, printed or saved
        if b'"log_history"' not in head and json_series.sniff(start):
            return "json-series"  # values by metric or by step (a framework's golden values)
        if path.suffix == ".json" or b'"log_history"' in head or not first_line.endswith(b"}"):
            return "hf"
        if _is_json(first_line):
            return "jsonl"
        return "text"  # a Python dict per line: the console of the HF Trainer, pasted
    if path.suffix == ".json":
        return "hf"
    first, second = (line.decode("utf-8", "replace").strip()
                     for line in [*start.split(b"\n", 2)[:2], b""][:2])
    if monitor.is_monitor(first, second):
        return "monitor"
    if metric_csv.is_metric_csv(first, second):
        return "metric-csv"
    exported_as = exported.sniff(first)
    if exported_as is not None:
        return exported_as
    if keras.is_header(first):
        return "keras"
    columns = [c.strip().strip('"') for c in first.split(",")]
    if "," in first and "step" in columns:
        return "lightning"
    if path.suffix == ".csv":  # its header names the columns: read as that table alone
        return "text:table"
    if len(head) >= 12 and _looks_like_tfrecord(head):
        return "tensorboard"
    return "text"


def _is_json(line: bytes) -> bool:
    import json

    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _looks_like_tfrecord(head: bytes) -> bool:
    import numpy as np

    data = np.frombuffer(head[:12], dtype=np.uint8)
    crc = tensorboard.masked_crc32c(data, np.array([0]), np.array([8]))[0]
    return int(crc) == int.from_bytes(head[8:12], "little")
