"""Writes a run to its store from a background thread.

The training thread only enqueues records. The writer thread drains the queue and commits each
batch in one transaction; SQLite's write-ahead log makes every committed step survive a SIGKILL of
the process. If the disk fails, the store reports it once and drops records: monitoring must never
stop training.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.events import Event
from trainguard.store.schema import SCHEMA, SCHEMA_VERSION

DB_NAME = "trainguard.db"
log = logging.getLogger("trainguard")
_STOP = object()


def to_json(value: Any) -> str:
    return json.dumps(value, default=_json_default, allow_nan=True)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return repr(value)


def strict_json(value: Any) -> Any:
    """For strict JSON readers: non-finite numbers become the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def to_blob(values: np.ndarray) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


class RunStore:
    """Asynchronous writer of one run directory."""

    def __init__(self, run_dir: str | Path, *, max_queue: int = 10_000) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / DB_NAME
        self.failed: str | None = None
        self.dropped = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue)
        self._conn = sqlite3.connect(self.path, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(SCHEMA)
        self._conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)",
                           (str(SCHEMA_VERSION),))
        self._conn.commit()
        self._thread = threading.Thread(target=self._run, name="trainguard-store", daemon=True)
        self._thread.start()

    # -- enqueueing (training thread) ---------------------------------------------------------
    def _put(self, record: tuple) -> None:
        if self.failed is not None:
            self.dropped += 1
            return
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def put_meta(self, key: str, value: Any) -> None:
        self._put(("meta", key, to_json(value)))

    def put_step(self, step: int, scalars: dict[str, Any], grad_norms: np.ndarray | None) -> None:
        self._put(("step", step, time.time(), scalars,
                   None if grad_norms is None else to_blob(grad_norms)))

    def put_param_metrics(self, step: int, metrics: dict[str, np.ndarray]) -> None:
        self._put(("param", step, {k: to_blob(v) for k, v in metrics.items()}))

    def put_module_metrics(self, step: int, names: list[str],
                           metrics: dict[str, np.ndarray]) -> None:
        self._put(("module", step, to_json(names), {k: to_blob(v) for k, v in metrics.items()}))

    def put_event(self, event: Event) -> None:
        self._put(("event", event))

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until everything enqueued so far is committed."""
        if self.failed is not None or not self._thread.is_alive():
            return
        done = threading.Event()
        try:
            self._queue.put(("flush", done), timeout=timeout)
        except queue.Full:
            return
        done.wait(timeout)

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout=30)
        try:
            self._conn.close()
        except sqlite3.Error:
            pass

    # -- writing (store thread) ---------------------------------------------------------------
    def _run(self) -> None:
        stop = False
        while not stop:
            records = [self._queue.get()]
            while len(records) < 1000:
                try:
                    records.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            flushes = []
            batch = []
            for record in records:
                if record is _STOP:
                    stop = True
                elif record[0] == "flush":
                    flushes.append(record[1])
                else:
                    batch.append(record)
            if batch and self.failed is None:
                try:
                    self._write(batch)
                except (sqlite3.Error, OSError) as exc:
                    self._fail(exc, len(batch))
            elif batch:
                self.dropped += len(batch)
            for done in flushes:
                done.set()

    def _fail(self, exc: BaseException, lost: int) -> None:
        self.failed = f"{type(exc).__name__}: {exc}"
        self.dropped += lost
        log.error("trainguard: the run store at %s stopped writing (%s); training goes on "
                  "without it", self.path, self.failed)
        try:
            self._conn.rollback()
        except sqlite3.Error:
            pass

    def _write(self, batch: list[tuple]) -> None:
        with self._conn:
            for record in batch:
                tag = record[0]
                if tag == "step":
                    _, step, at, scalars, blob = record
                    self._conn.execute("INSERT OR REPLACE INTO steps VALUES (?, ?, ?, ?)",
                                       (step, at, to_json(scalars), blob))
                elif tag == "param":
                    _, step, metrics = record
                    self._conn.executemany(
                        "INSERT OR REPLACE INTO param_metrics VALUES (?, ?, ?)",
                        [(step, k, v) for k, v in metrics.items()])
                elif tag == "module":
                    _, step, names, metrics = record
                    self._conn.executemany(
                        "INSERT OR REPLACE INTO module_metrics VALUES (?, ?, ?, ?)",
                        [(step, k, names, v) for k, v in metrics.items()])
                elif tag == "event":
                    event: Event = record[1]
                    self._conn.execute(
                        "INSERT INTO events (step, kind, severity, param, value, message, details)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (event.step, event.kind, event.severity, event.param,
                         to_json(event.value), event.message, to_json(event.details)))
                elif tag == "meta":
                    _, key, value = record
                    self._conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
