"""MLflow runs in a local tracking store: a run's metric history, read without mlflow.

Three ways a store is named, each read directly (the store's own layout, no mlflow needed):
- `mlflow.db`, MLflow's default SQLite store: its `metrics` table (read with `sqlite3`, read
  only). MLflow keeps a NaN there as 0.0 with `is_nan` set, and an inf as the largest double of
  its sign: both are read back as NaN and inf;
- an `mlruns` folder (the file store): `<experiment>/<run>/metrics/<key>`, one `timestamp value
  step` line per value (a key with a `/` is a folder);
- a tracking URI, `sqlite:///path/mlflow.db` or `file:///path/mlruns`.

A store holds many runs. `run_id` picks one (by id, or by its name when that is unique); else the
newest run that logged metrics is read (the run just made, as `wandb/latest-run` is), and a note
names it and says how many others there are.

Rows are at the step the logger gave (`state.global_step` under the HF Trainer's
`MLflowCallback`, the global step under Lightning's `MLFlowLogger`). Values logged together with
`train_runtime` are the HF Trainer's closing totals (`train_loss` is the run's mean loss): left
out, as the `trainer_state.json` reader leaves out its closing entry; Lightning's epoch
aggregates beside its step values are left out as in a `metrics.csv`. Values logged without a
step all land at step 0: those are numbered by the order they were logged in, with a note.
"""

from __future__ import annotations

import re
import sqlite3
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import unquote, urlparse

from trainguard.analyze.lightning import epoch_aggregates
from trainguard.analyze.log import Log, LogBuilder, LogError
from trainguard.analyze.source import Lines, head

FORMAT = "mlflow"
DB_NAME = "mlflow.db"
FILE_STORE = "mlruns"
CLOSING = "train_runtime"
"""A value the HF Trainer logs once, with the run's totals, at its end."""
_TABLES = {"runs", "metrics", "experiments"}
_SQLITE = b"SQLite format 3\0"

Metric = tuple[str, float, int, int]
"""(key, value, step, timestamp in ms)"""


@dataclass(frozen=True, slots=True)
class Run:
    run_id: str
    name: str
    start_ms: int
    where: str


def local_store(uri: str) -> Path | None:
    """The local path of a tracking URI (`sqlite:///...`, `file:///...`), None for a path;
    a `LogError` for a tracking server, which is not read."""
    scheme = uri.split(":", 1)[0].lower() if re.match(r"^[A-Za-z][\w+.-]+:", uri) else ""
    if not scheme or (len(scheme) == 1 and sys.platform == "win32"):
        return None
    if scheme in ("sqlite", "file"):
        parsed = urlparse(uri)
        return Path(unquote(parsed.netloc + parsed.path) if scheme == "file"
                    else unquote(parsed.path[1:] if parsed.path.startswith("//") else
                                 parsed.path))
    raise LogError(f"{uri}: a tracking server; trainguard analyze reads a local MLflow store "
                   "(sqlite:///path/mlflow.db, file:///path/mlruns, or the path itself)")


def is_db(path: Path) -> bool:
    """An SQLite file holding MLflow's tables."""
    if not path.is_file():
        return False
    try:
        if not head(path, 16).startswith(_SQLITE):
            return False
    except LogError:
        return False
    try:
        with _connect(path) as db:
            names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except (sqlite3.Error, LogError):
        return False
    return _TABLES <= names


def is_mlflow(path: Path) -> bool:
    """An MLflow store: `mlflow.db`, an `mlruns` folder, a run of one, or a folder holding one."""
    if path.is_file():
        return is_db(path)
    if not path.is_dir():
        return False
    return (is_db(path / DB_NAME) or _is_file_run(path) or bool(_file_runs(path))
            or bool(_file_runs(path / FILE_STORE)))


def read(path: str | Path, run_id: str | None = None) -> Log:
    path = Path(path)
    notes: list[str] = []
    if path.is_dir() and is_db(path / DB_NAME) and not _file_runs(path):
        path = path / DB_NAME
    if path.is_file():
        if not is_db(path):
            raise LogError(f"{path}: not an MLflow store (an SQLite file without MLflow's "
                           "runs and metrics tables)")
        run = _choose(path, _db_runs(path), run_id, notes)
        metrics = _db_metrics(path, run.run_id)
    else:
        if _is_file_run(path):
            run = _file_run(path)
            if run_id is not None and run_id not in (run.run_id, run.name):
                raise LogError(f"{path}: holds MLflow run {run.run_id}, not {run_id}")
        else:
            store = path if _file_runs(path) else path / FILE_STORE
            run = _choose(path, _file_runs(store), run_id, notes)
        metrics = _file_metrics(Path(run.where))
    log = LogBuilder(run.where, FORMAT)
    log.notes.extend(notes)
    _add(log, metrics)
    return log.build(what=f"training values (run {run.run_id} logged no metric)")


def _add(log: LogBuilder, metrics: list[Metric]) -> None:
    closing = {(step, ts) for key, _, step, ts in metrics if key == CLOSING}
    # The last step's loss can share the totals' millisecond: a key logged elsewhere is a row's.
    elsewhere = {key for key, _, step, ts in metrics if (step, ts) not in closing}
    aggregates = epoch_aggregates({m[0] for m in metrics})
    kept = [m for m in metrics if ((m[2], m[3]) not in closing or m[0] in elsewhere)
            and m[0] not in aggregates]
    if closing:
        log.notes.append("the values logged with train_runtime are the run's closing totals; "
                         "left out")
    counts: dict[str, int] = {}
    for key, _, step, _ in kept:
        if step == 0:
            counts[key] = counts.get(key, 0) + 1
    unstepped = all(m[2] == 0 for m in kept) and max(counts.values(), default=0) > 1
    if unstepped:
        log.notes.append("every value is logged at step 0 (no step given): rows are numbered "
                         "by the order each metric was logged in")
    kept.sort(key=lambda m: (m[2], m[3]))
    order: dict[str, int] = {}
    for key, value, step, _ in kept:
        if unstepped:
            step = order[key] = order.get(key, -1) + 1
        log.add_values(step, ((key, value),))


# -- the SQLite store ------------------------------------------------------------------------------
def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)


def _db_runs(path: Path) -> list[Run]:
    query = ("SELECT r.run_uuid, COALESCE(r.name, ''), COALESCE(r.start_time, 0) FROM runs r "
             "WHERE r.lifecycle_stage = 'active' AND EXISTS "
             "(SELECT 1 FROM metrics m WHERE m.run_uuid = r.run_uuid) ORDER BY r.start_time")
    try:
        with _connect(path) as db:
            rows = db.execute(query).fetchall()
    except sqlite3.Error as exc:
        raise LogError(f"{path}: cannot be read as an MLflow store ({exc})") from None
    return [Run(str(uuid), str(name), int(start), str(path)) for uuid, name, start in rows]


_DOUBLE_MAX = sys.float_info.max


def _db_metrics(path: Path, run_id: str) -> list[Metric]:
    query = ("SELECT key, value, is_nan, step, timestamp FROM metrics WHERE run_uuid = ? "
             "ORDER BY step, timestamp")
    try:
        with _connect(path) as db:
            rows = db.execute(query, (run_id,)).fetchall()
    except sqlite3.Error as exc:
        raise LogError(f"{path}: cannot be read as an MLflow store ({exc})") from None
    return [(str(key), _stored(value, bool(is_nan)), int(step), int(ts))
            for key, value, is_nan, step, ts in rows]


def _stored(value: float, is_nan: bool) -> float:
    """A value as it was logged: MLflow's SQL store keeps NaN as 0.0 with `is_nan`, and clamps
    an inf to the largest double of its sign."""
    if is_nan:
        return float("nan")
    value = float(value)
    if abs(value) >= _DOUBLE_MAX:
        return float("inf") if value > 0 else float("-inf")
    return value


# -- the file store --------------------------------------------------------------------------------
def _is_file_run(path: Path) -> bool:
    return (path / "meta.yaml").is_file() and (path / "metrics").is_dir()


def _file_runs(store: Path) -> list[Run]:
    if not store.is_dir():
        return []
    runs = [_file_run(run) for run in store.glob("*/*") if _is_file_run(run)]
    return sorted((r for r in runs if r.where), key=lambda r: r.start_ms)


def _file_run(run: Path) -> Run:
    meta = _meta(run / "meta.yaml")
    if meta.get("lifecycle_stage") == "deleted" or not any(
            p.is_file() for p in (run / "metrics").rglob("*")):
        return Run(meta.get("run_id", run.name), meta.get("run_name", ""), 0, "")
    start = meta.get("start_time", "0")
    return Run(meta.get("run_id", run.name), meta.get("run_name", ""),
               int(start) if start.isdigit() else 0, str(run))


def _meta(path: Path) -> dict[str, str]:
    """The flat `key: value` fields of a run's `meta.yaml` (no YAML library needed)."""
    fields: dict[str, str] = {}
    for line in Lines(path):
        key, colon, value = line.partition(":")
        if colon and key and not key.startswith((" ", "-")):
            fields[key.strip()] = value.strip().strip("'\"")
    return fields


def _file_metrics(run: Path) -> list[Metric]:
    metrics: list[Metric] = []
    folder = run / "metrics"
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        key = file.relative_to(folder).as_posix()
        for number, line in enumerate(Lines(file), 1):
            parts = line.split()
            if not parts:
                continue
            try:
                ts, value = int(parts[0]), float(parts[1])
                step = int(parts[2]) if len(parts) > 2 else 0
            except (ValueError, IndexError):
                raise LogError(f"{file}: line {number} is not 'timestamp value step'") from None
            metrics.append((key, value, step, ts))
    return metrics


# -- choosing a run --------------------------------------------------------------------------------
def _choose(store: Path, runs: list[Run], run_id: str | None, notes: list[str]) -> Run:
    if not runs:
        raise LogError(f"{store}: no MLflow run with logged metrics in this store")
    if run_id is not None:
        chosen = [r for r in runs if r.run_id == run_id] or [r for r in runs if r.name == run_id]
        if len(chosen) != 1:
            why = "names several runs" if chosen else "is no run of it"
            raise LogError(f"{store}: {run_id!r} {why} (its runs: {_listed(runs)})")
        return chosen[0]
    run = runs[-1]
    if len(runs) > 1:
        notes.append(f"{len(runs)} MLflow runs in this store; read the newest, {run.run_id}"
                     f"{f' ({run.name})' if run.name else ''}, started {_when(run.start_ms)} "
                     "(--run-id picks another)")
    return run


def _listed(runs: Iterable[Run]) -> str:
    shown = [f"{r.run_id} ({r.name})" if r.name else r.run_id for r in list(runs)[-6:]]
    return ", ".join(shown)


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
