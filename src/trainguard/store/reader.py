"""Reads a run store. Used by `trainguard show`, `trainguard runs` and by later analysis.

A run directory holds every run started in it; `RunReader(run_dir)` reads the latest one,
`RunReader(run_dir, run=1)` an earlier one, and `runs()` lists them all. Version 1 stores (one
run, no `runs` table) read as a single run with id 1.

Every method returns plain Python / NumPy values. Non-finite values come back as NaN or inf,
never dropped, and `summary()` counts them explicitly. A value of the wrong shape or type (a step
that is not a JSON object, a loss that is a string, a blob of the wrong length) raises a
`StoreError` naming it, never a stray `TypeError`.

Readers never write and never lock: a store on read-only media is read with SQLite's
`immutable` mode when the normal read-only mode cannot be used.

A store is read as untrusted input, with limits that keep a small hostile file from taking the
reader's memory or stack: a table with a generated (computed) column or a virtual table is
refused (trainguard writes neither; such a column makes any value out of a few bytes), SQLite
refuses any one value over `MAX_VALUE_BYTES`, a JSON value over `MAX_JSON_BYTES` or nested
deeper than `MAX_JSON_DEPTH` is refused before it is parsed, the run's meta may hold
`MAX_META_BYTES` in all, and a per-parameter vector's size is checked with SQL `length()` against
the parameter count before any vector is fetched. Each refusal is one `StoreError` that states
the limit.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import sqlite3
from collections import Counter
from itertools import pairwise
from json.decoder import scanstring  # type: ignore[attr-defined]  # public, untyped
from pathlib import Path
from typing import Any, cast

import numpy as np

from trainguard.errors import StoreError
from trainguard.events import SEVERITY_RANK, ActionKind, ActionRecord, Event, Severity
from trainguard.store import schema
from trainguard.store.files import DB_NAME, LOCK_NAME, read_note
from trainguard.vocabulary import VERDICTS, verdict_named

STEP_NUMBERS = ("loss", "grad_norm", "lr", "loss_scale", "clip_coef", "fp16_grad_maxabs",
                "nonfinite_grads", "loss_curvature")
"""Per-step scalars that must be numbers (or null) when present."""
MiB = 1 << 20
MAX_VALUE_BYTES = 64 * MiB
"""SQLite refuses to produce any one value larger than this (SQLITE_LIMIT_LENGTH, Python 3.11+):
a damaged store cannot make the reader allocate more for one cell."""
MAX_JSON_BYTES = 16 * MiB
"""The largest JSON value read (a meta value, a step's record, an event's details). The largest
trainguard writes is the parameter names, about 6 MB for 100,000 parameters; parsing 16 MiB of
the worst JSON (`[{},{},...]`) takes about 450 MB."""
MAX_META_BYTES = 32 * MiB
"""The most a run's meta may hold in all (it is parsed whole)."""
MAX_JSON_DEPTH = 64
"""The deepest nesting of arrays and objects read; trainguard writes under 10 levels."""
_JSON_TOKENS = re.compile(r'["\[\]{}]')


def _json_depth_over(text: str, limit: int) -> bool:
    """True when `text` nests arrays and objects deeper than `limit` (brackets inside strings do
    not count). json.loads recurses once per level, so a deep value must be refused first."""
    if text.count("[") + text.count("{") <= limit:
        return False  # too few brackets to nest that deep: the common case costs two counts
    depth, pos = 0, 0
    search = _JSON_TOKENS.search
    while (match := search(text, pos)) is not None:
        char, pos = match.group(), match.end()
        if char == '"':
            try:
                pos = scanstring(text, pos)[1]
            except ValueError:
                return False  # an unterminated string: json.loads says where
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def _capped_parts(column: str) -> tuple[str, str]:
    """SQL for `column` (NULL when longer than `MAX_JSON_BYTES`: an oversized value is measured
    by SQLite and never fetched) and for its length."""
    return (f"CASE WHEN length({column}) > {MAX_JSON_BYTES} THEN NULL ELSE {column} END",
            f"length({column})")


def _capped(column: str) -> str:
    return ", ".join(_capped_parts(column))


def _size(count: int) -> str:
    return f"{count / MiB:.1f} MiB" if count >= MiB else f"{count:,} bytes"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _connect(path: Path) -> tuple[sqlite3.Connection, bool]:
    """Open read-only; on read-only media fall back to `immutable=1`. Returns (conn, immutable).

    The URI comes from the resolved path, percent-encoded, so that '#', '?' and '%' in
    directory names are part of the path and not read as URI syntax."""
    uri = path.resolve().as_uri()
    try:
        conn = _limited(sqlite3.connect(f"{uri}?mode=ro", uri=True))
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn, False
    except sqlite3.OperationalError as exc:
        # A WAL store needs its -shm file; in a directory that cannot be written it cannot be
        # created, and only immutable mode reads the store.
        if "locked" in str(exc) or "busy" in str(exc):
            raise
    conn = _limited(sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True))
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    return conn, True


def _limited(conn: sqlite3.Connection) -> sqlite3.Connection:
    setlimit = getattr(conn, "setlimit", None)  # Python 3.11+
    if setlimit is not None:
        setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    return conn


def _computed_column(conn: sqlite3.Connection) -> str | None:
    """The first of trainguard's tables that is virtual or has a generated column, described;
    None when every table stores what it returns."""
    tables = schema.V2_TABLES | schema.V1_TABLES
    for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"):
        if name not in tables:
            continue
        if not isinstance(sql, str) or not sql.lstrip().upper().startswith("CREATE TABLE"):
            return f"table {name} is a virtual table"
        for column in conn.execute(f'PRAGMA table_xinfo("{name}")'):
            if column[6] != 0:  # 2: generated virtual, 3: generated stored, 1: hidden
                return f"column {name}.{column[1]} is computed, not stored"
    return None


class RunReader:
    def __init__(self, run_dir: str | Path, run: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        if not self.run_dir.exists():
            raise StoreError(f"no run directory at {self.run_dir}")
        if not self.run_dir.is_dir():
            raise StoreError(f"{self.run_dir} is not a directory")
        self.path = self.run_dir / DB_NAME
        if not self.path.is_file():
            raise StoreError(f"{self.run_dir} is not a trainguard run (no {DB_NAME} in it)")
        try:
            self._conn, self.immutable = _connect(self.path)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path} is corrupt or not a trainguard store ({exc})") from None
        wal = Path(f"{self.path}-wal")
        self.wal_unread = self.immutable and wal.is_file() and wal.stat().st_size > 0
        """True when the store was read without its write-ahead log (read-only media after a
        writer was killed): the last committed records may be missing."""
        try:
            version = schema.store_version(self._conn)
        except sqlite3.Error as exc:
            self._conn.close()
            raise StoreError(f"{self.path} is corrupt or not a trainguard store ({exc})") from None
        if version is None or version == 0:
            self._conn.close()
            raise StoreError(f"{self.path} is not a trainguard store (it lacks trainguard's "
                             f"tables)")
        if version > schema.SCHEMA_VERSION:
            self._conn.close()
            raise StoreError(f"{self.path} was written by a newer trainguard (store version "
                             f"{version}; this one reads up to {schema.SCHEMA_VERSION})")
        try:
            computed = _computed_column(self._conn)
        except sqlite3.Error as exc:
            self._conn.close()
            raise StoreError(f"{self.path} is corrupt or not a trainguard store ({exc})") from None
        if computed is not None:
            self._conn.close()
            raise StoreError(f"{self.path} is not a trainguard store: its {computed} "
                             f"(trainguard stores every value it records)")
        self.version = version
        """The store's schema version (1: one run, no runs table; 2: runs kept apart)."""
        self.run_ids = self._run_ids()
        if not self.run_ids:
            self._conn.close()
            raise StoreError(f"{self.path} holds no runs yet")
        if run is None:
            self.run_id = self.run_ids[-1]
        elif not _is_number(run) or int(run) != run or int(run) not in self.run_ids:
            self._conn.close()
            raise StoreError(f"no run {run!r} in {self.run_dir} (its runs: "
                             f"{_id_ranges(self.run_ids)})")
        else:
            self.run_id = int(run)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> RunReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- low level -------------------------------------------------------------------------------
    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.DataError as exc:
            if "too big" not in str(exc):
                raise StoreError(f"{self.path} is corrupt ({exc})") from None
            raise StoreError(f"{self.path} holds a value larger than {_size(MAX_VALUE_BYTES)}, "
                             f"trainguard's limit for one stored value; the store is damaged or "
                             f"was not written by trainguard") from None
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path} is corrupt ({exc})") from None

    def _select(self, sql: str, args: tuple = ()) -> list[tuple]:
        """`sql` with `{run}` standing for this run's condition (every row in a v1 store)."""
        if self.version == 1:
            return self._query(sql.format(run="1"), args)
        return self._query(sql.format(run="run_id = ?"), (self.run_id, *args))

    def _bad(self, what: str, value: Any, expected: str) -> StoreError:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return StoreError(f"{self.path}: run {self.run_id}: {what} is {shown}, expected "
                          f"{expected}; the store is damaged or was not written by trainguard")

    def _too_big(self, what: str, size: int, limit: int, unit: str = "one value") -> StoreError:
        return StoreError(f"{self.path}: run {self.run_id}: {what} is {_size(size)}, over "
                          f"trainguard's limit of {_size(limit)} for {unit}; the store is "
                          f"damaged or was not written by trainguard")

    def _json(self, text: Any, what: str, size: Any = None) -> Any:
        """`text` parsed; `size` is its SQL length() when the query capped it (`_capped`)."""
        if isinstance(size, int) and size > MAX_JSON_BYTES:
            raise self._too_big(what, size, MAX_JSON_BYTES)
        if not isinstance(text, str):
            raise self._bad(what, text, "JSON text")
        if len(text) > MAX_JSON_BYTES:  # characters: at least as many bytes
            raise self._too_big(what, len(text), MAX_JSON_BYTES)
        if _json_depth_over(text, MAX_JSON_DEPTH):
            raise StoreError(f"{self.path}: run {self.run_id}: {what} nests arrays or objects "
                             f"deeper than {MAX_JSON_DEPTH} levels, trainguard's limit; the store "
                             f"is damaged or was not written by trainguard")
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise StoreError(f"{self.path}: run {self.run_id}: malformed {what} "
                             f"({str(exc)[:200]})") from None

    def _int(self, value: Any, what: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._bad(what, value, "a whole number")
        return value

    def _str(self, value: Any, what: str) -> str:
        if not isinstance(value, str):
            raise self._bad(what, value, "text")
        return value

    def _severity(self, value: Any, what: str) -> Severity:
        if value not in SEVERITY_RANK:
            raise self._bad(what, value, f"one of {', '.join(SEVERITY_RANK)}")
        return cast(Severity, value)

    def _opt_str(self, value: Any, what: str) -> str | None:
        return None if value is None else self._str(value, what)

    def _num(self, value: Any, what: str) -> float | None:
        if value is None:
            return None
        if not _is_number(value):
            raise self._bad(what, value, "a number")
        return float(value)

    def _blob(self, data: Any, what: str, width: int | None) -> np.ndarray:
        if not isinstance(data, bytes) or len(data) % 4:
            size = f"{len(data)} bytes" if isinstance(data, bytes) else type(data).__name__
            raise StoreError(f"{self.path}: run {self.run_id}: {what} holds {size}, not a "
                             f"float32 vector; the store is damaged")
        if width is not None and len(data) // 4 != width:  # before the float64 copy
            raise StoreError(f"{self.path}: run {self.run_id}: {what} holds {len(data) // 4} "
                             f"values for {width} entries; the store is damaged")
        return np.frombuffer(data, dtype="<f4").astype(np.float64)

    def _check_blob_sizes(self, sql: str, args: tuple, what: str, width: int) -> None:
        """Refuse before fetching when a vector holds more than `width` float32 values: `sql`
        selects (step, length(blob)) of the rows whose blob is longer than its last argument."""
        over = self._select(sql + " LIMIT 1", (*args, 4 * width))
        if over:
            step, size = over[0]
            raise StoreError(f"{self.path}: run {self.run_id}: {what} of step {step} holds "
                             f"{_size(size)}, more than the {_size(4 * width)} of {width} float32 "
                             f"values (one per parameter); the store is damaged")

    # -- runs ----------------------------------------------------------------------------------
    def _run_ids(self) -> list[int]:
        if self.version == 1:
            return [1]
        ids = [row[0] for row in self._query("SELECT id FROM runs ORDER BY id")]
        if not all(isinstance(i, int) for i in ids):
            raise StoreError(f"{self.path}: a run id is not a whole number; the store is damaged")
        return ids

    def runs(self) -> list[dict[str, Any]]:
        """Every run in the directory, oldest first: id, started, ended, status, pid, hostname,
        resumed, store_failed, dropped, steps, events, last_step, verdict, error (the type of
        the exception that ended it)."""
        if self.version == 1:
            first, last, count = self._query("SELECT min(time), max(time), count(*) "
                                             "FROM steps")[0]
            status = self.meta().get("status", "unknown")
            events = self._query("SELECT count(*) FROM events")[0][0]
            last_step = self._query("SELECT max(step) FROM steps")[0][0]
            return [{"id": 1, "started": first, "ended": None if status == "running" else last,
                     "status": status, "pid": None, "hostname": None, "resumed": 0,
                     "store_failed": None, "failed_step": None, "dropped": 0,
                     "dropped_steps": 0, "steps": count,
                     "events": events, "last_step": last_step, "verdict": None,
                     "error": None}]
        verdict_of = "FROM meta m WHERE m.run_id = r.id AND m.key = 'verdict'"
        error_of = "FROM meta m WHERE m.run_id = r.id AND m.key = 'error'"
        value, length = _capped_parts("value")
        columns = {row[1] for row in self._query("PRAGMA table_info(runs)")}
        dropped_steps = "r.dropped_steps" if "dropped_steps" in columns else "0"
        rows = self._query(
            "SELECT r.id, r.started, r.ended, r.status, r.pid, r.hostname, r.resumed, "
            f"r.store_failed, r.failed_step, r.dropped, {dropped_steps}, "
            "(SELECT count(*) FROM steps s WHERE s.run_id = r.id), "
            "(SELECT count(*) FROM events e WHERE e.run_id = r.id), "
            "(SELECT max(step) FROM steps s WHERE s.run_id = r.id), "
            f"(SELECT {value} {verdict_of}), (SELECT {length} {verdict_of}), "
            f"(SELECT {value} {error_of}), (SELECT {length} {error_of}) "
            "FROM runs r ORDER BY r.id")
        listing = []
        note = read_note(self.run_dir / LOCK_NAME)
        for (run_id, started, ended, status, pid, host, resumed, failed, failed_step, dropped,
             lost_steps, steps, events, last_step, verdict_text, verdict_size, error_text,
             error_size) in rows:
            what = f"run {run_id}"
            verdict = (self._verdict(self._json(verdict_text, f"{what} verdict", verdict_size))
                       if verdict_size is not None else None)
            error = (self._error(self._json(error_text, f"{what} error", error_size))
                     if error_size is not None else None)
            listing.append({
                "id": run_id, "started": self._num(started, f"{what} start time"),
                "ended": self._num(ended, f"{what} end time"),
                "status": self._str(status, f"{what} status"),
                "pid": pid if isinstance(pid, int) else None,
                "hostname": host if isinstance(host, str) else None,
                "resumed": resumed if isinstance(resumed, int) else 0,
                "store_failed": self._opt_str(failed, f"{what} store failure"),
                "failed_step": failed_step if isinstance(failed_step, int) else None,
                "dropped": dropped if isinstance(dropped, int) else 0,
                "dropped_steps": lost_steps if isinstance(lost_steps, int) else 0,
                "steps": steps, "events": events, "last_step": last_step,
                "verdict": verdict["verdict"] if verdict else None,
                "error": error["type"] if error else None})
            if note is not None and note.get("run_id") == run_id and note.get("pid") == pid:
                _merge_note(listing[-1], note)
        return listing

    def _verdict(self, value: Any) -> dict[str, Any]:
        # a verdict of None: the run was too short to judge, as its message says
        # an older store may say its verdict in older words: read in today's
        if not (isinstance(value, dict) and (verdict_named(value.get("verdict")) is not None
                                             or value.get("verdict") is None)
                and isinstance(value.get("message"), str)):
            raise self._bad("meta verdict", value, f"a verdict ({', '.join(VERDICTS)})")
        return {**value, "verdict": verdict_named(value.get("verdict"))}

    def _error(self, value: Any) -> dict[str, Any]:
        if not (isinstance(value, dict) and isinstance(value.get("type"), str)
                and isinstance(value.get("message"), str)):
            raise self._bad("meta error", value, "the exception that ended the run "
                                                 "(its type and message)")
        return value

    def run_info(self) -> dict[str, Any]:
        """The `runs()` entry of the run this reader reads."""
        return next(r for r in self.runs() if r["id"] == self.run_id)

    # -- run-level -------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        # Sizes first, with SQL length(), so that no oversized value is fetched.
        sizes = self._select("SELECT key, length(value) FROM meta WHERE {run}")
        total = 0
        for key, size in sizes:
            if isinstance(size, int):
                if size > MAX_JSON_BYTES:
                    raise self._too_big(f"meta {key}", size, MAX_JSON_BYTES)
                total += size
        if total > MAX_META_BYTES:
            raise self._too_big("its meta", total, MAX_META_BYTES, "a run's meta")
        meta = {key: self._json(value, f"meta {key}", size) for key, value, size in
                self._select(f"SELECT key, {_capped('value')} FROM meta WHERE {{run}}")}
        meta.pop("schema_version", None)
        if self.version >= 2:  # the runs row holds the status
            status = self._query("SELECT status FROM runs WHERE id = ?", (self.run_id,))
            if status:
                meta["status"] = status[0][0]
        self._check_meta(meta)
        return meta

    def _check_meta(self, meta: dict[str, Any]) -> None:
        """Raise on what no trainguard writes; put an older store's verdict in today's words."""
        for key in ("status", "trainguard_version", "snapshot", "integration"):
            self._opt_str(meta.get(key), f"meta {key}")
        for key in ("config", "distributed"):
            if key in meta and not isinstance(meta[key], dict):
                raise self._bad(f"meta {key}", meta[key], "a JSON object")
        names = meta.get("param_names", [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise self._bad("meta param_names", names, "a list of names")
        if "verdict" in meta:
            meta["verdict"] = self._verdict(meta["verdict"])
        if "error" in meta:
            self._error(meta["error"])
        evals = meta.get("eval", [])
        if not (isinstance(evals, list) and all(
                isinstance(e, dict) and isinstance(e.get("step"), int)
                and isinstance(e.get("metrics"), dict)
                and all(_is_number(v) for v in e["metrics"].values()) for e in evals)):
            raise self._bad("meta eval", evals, "a list of {step, metrics} records")
        widths = meta.get("param_widths")
        if widths is not None and not (
                isinstance(widths, list) and widths and all(
                    isinstance(w, list) and len(w) == 2 and all(isinstance(v, int) for v in w)
                    for w in widths)
                and widths[0][0] == 0 and widths[-1][1] == len(names)
                and all(a[0] <= b[0] and a[1] <= b[1] for a, b in pairwise(widths))):
            raise self._bad("meta param_widths", widths,
                            "a list of [first step, count] pairs ending at the names' count")
        shapes = meta.get("param_shapes", [])
        if not isinstance(shapes, list) or not all(
                isinstance(s, list) and all(_is_number(d) for d in s) for s in shapes):
            raise self._bad("meta param_shapes", shapes, "a list of shapes")
        for cause in self._records(meta, "diagnosis", ("code", "fix")):
            self._num(cause.get("confidence", 0), "a diagnosis confidence")
            evidence = cause.get("evidence", [])
            if not isinstance(evidence, list) or not all(isinstance(e, str) for e in evidence):
                raise self._bad("a diagnosis's evidence", evidence, "a list of text")
        self._records(meta, "preflight", ("check", "severity", "message"))

    def _records(self, meta: dict[str, Any], key: str,
                 fields: tuple[str, ...]) -> list[dict[str, Any]]:
        records = meta.get(key, [])
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise self._bad(f"meta {key}", records, "a list of JSON objects")
        for record in records:
            for name in fields:
                self._str(record.get(name), f"meta {key} {name}")
        return records

    def config(self) -> dict[str, Any]:
        return self.meta().get("config", {})

    def param_names(self) -> list[str]:
        return list(self.meta().get("param_names", []))

    # -- per step ---------------------------------------------------------------------------
    def steps(self) -> list[dict[str, Any]]:
        """One dict per recorded step: step, time, loss, grad_norm, lr, action, ..."""
        rows = self._select(f"SELECT step, time, {_capped('data')} FROM steps WHERE {{run}} "
                            f"ORDER BY step")
        out = []
        for step, at, data, size in rows:
            self._int(step, "a step number")
            values = self._json(data, f"step {step}", size)
            if not isinstance(values, dict):
                raise self._bad(f"step {step}", values, "a JSON object")
            for name in STEP_NUMBERS:
                self._num(values.get(name), f"step {step} {name}")
            self._str(values.get("action", ""), f"step {step} action")
            lrs = values.get("lrs")
            if lrs is not None and not (isinstance(lrs, list) and all(
                    v is None or _is_number(v) for v in lrs)):
                raise self._bad(f"step {step} lrs", lrs, "a list of numbers")
            out.append({"step": step, "time": self._num(at, f"step {step} time"), **values})
        return out

    def scalar(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of one per-step scalar, over the steps that hold it: a step without
        one (a policy-gradient loop hands no loss) is left out, not read as a NaN."""
        rows = [r for r in self.steps() if r.get(name) is not None]
        steps = np.array([r["step"] for r in rows], dtype=np.int64)
        values = [self._num(r[name], f"step {r['step']} {name}") for r in rows]
        return steps, np.array(values, dtype=np.float64)

    def param_grad_norms(self) -> tuple[np.ndarray, np.ndarray]:
        """(steps, matrix[step, param]) of per-parameter gradient norms."""
        meta = self.meta()
        if "param_names" in meta:
            self._check_blob_sizes("SELECT step, length(grad_norms) FROM steps WHERE {run} AND "
                                   "length(grad_norms) > ? ORDER BY step", (), "gradient norms",
                                   len(meta["param_names"]))
        rows = self._select("SELECT step, grad_norms FROM steps WHERE {run} AND grad_norms IS "
                            "NOT NULL ORDER BY step")
        return self._matrix(rows, "gradient norms", 0.0, meta)  # not yet watched: no gradient

    def param_metric(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, matrix[step, param]) of a sampled per-parameter metric (e.g. update_ratio)."""
        meta = self.meta()
        if "param_names" in meta:
            self._check_blob_sizes("SELECT step, length(data) FROM param_metrics WHERE {run} AND "
                                   "metric = ? AND length(data) > ? ORDER BY step", (metric,),
                                   metric, len(meta["param_names"]))
        rows = self._select("SELECT step, data FROM param_metrics WHERE {run} AND metric = ? "
                            "ORDER BY step", (metric,))
        return self._matrix(rows, metric, np.nan, meta)  # not yet watched: not measured

    def param_metric_names(self) -> list[str]:
        return [r[0] for r in self._select("SELECT DISTINCT metric FROM param_metrics "
                                           "WHERE {run}")]

    def module_metric(self, metric: str) -> list[tuple[int, list[str], np.ndarray]]:
        """[(step, module names, values)] of a sampled per-module metric (e.g. act_maxabs)."""
        # Each name takes at least three characters of its JSON list ("",), so a vector of
        # float32 values, one per name, is never longer than 4/3 of the list's text.
        over = self._select("SELECT step, length(data), length(names) FROM module_metrics "
                            "WHERE {run} AND metric = ? AND length(data) > 4 * length(names) / 3 "
                            "+ 4 ORDER BY step LIMIT 1", (metric,))
        if over:
            step, size, names_size = over[0]
            raise StoreError(f"{self.path}: run {self.run_id}: {metric} of step {step} holds "
                             f"{_size(size)}, more than one float32 value per module its "
                             f"{_size(names_size)} of names can list; the store is damaged")
        rows = self._select(f"SELECT step, {_capped('names')}, data FROM module_metrics WHERE "
                            f"{{run}} AND metric = ? ORDER BY step", (metric,))
        out = []
        for step, names_text, names_size, data in rows:
            names = self._json(names_text, "module names", names_size)
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise self._bad(f"step {step} module names", names, "a list of names")
            out.append((self._int(step, "a step number"), names,
                        self._blob(data, f"{metric} of step {step}", len(names))))
        return out

    def _matrix(self, rows: list[tuple], what: str, fill: float,
                meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """One row per step. Parameters the optimizer gained mid-run (meta `param_widths`) have
        no value before they were watched: their columns hold `fill` there."""
        width: int | None = len(meta["param_names"]) if "param_names" in meta else None
        if "verdict" in meta:
            self._verdict(meta["verdict"])
        widths = meta.get("param_widths")
        vectors = []
        for step, data in rows:
            expected = width
            if widths and width is not None:
                expected = next(n for first, n in reversed(widths) if first <= step)
            values = self._blob(data, f"{what} of step {step}", expected)
            if width is None:
                width = values.size
            elif values.size < width:
                values = np.concatenate([values, np.full(width - values.size, fill)])
            vectors.append(values)
        steps = np.array([self._int(r[0], "a step number") for r in rows], dtype=np.int64)
        matrix = (np.vstack(vectors) if vectors
                  else np.full((0, width or 0), np.nan))
        return steps, matrix

    def events(self) -> list[Event]:
        """The run's events in step order (those of one step in the order they were detected:
        an event of a sampled step's heavy probes is detected a step later)."""
        rows = self._select(f"SELECT step, kind, severity, param, {_capped('value')}, message, "
                            f"{_capped('details')} FROM events WHERE {{run}} ORDER BY step, id")
        out = []
        for step, kind, severity, param, value, value_size, message, details, size in rows:
            self._int(step, "an event's step")
            where = f"the event at step {step}"
            loaded = (self._json(value, f"{where}'s value", value_size)
                      if value_size is not None else None)
            extra = self._json(details, f"{where}'s details", size)
            if not isinstance(extra, dict):
                raise self._bad(f"{where}'s details", extra, "a JSON object")
            out.append(Event(kind=self._str(kind, f"{where}'s kind"),
                             step=step,
                             severity=self._severity(severity, f"{where}'s severity"),
                             message=self._str(message, f"{where}'s message"),
                             param=self._opt_str(param, f"{where}'s parameter"),
                             value=self._num(loaded, f"{where}'s value"), details=extra))
        return out

    def actions(self) -> list[ActionRecord]:
        """What trainguard did to the run (skip, clip, rollback, LR change, halt, snapshot)."""
        if self.version == 1:
            return []
        rows = self._select(f"SELECT step, kind, message, {_capped('details')} FROM actions "
                            f"WHERE {{run}} ORDER BY id")
        out = []
        for step, kind, message, details, size in rows:
            where = f"the action at step {step}"
            extra = self._json(details, f"{where}'s details", size)
            if not isinstance(extra, dict):
                raise self._bad(f"{where}'s details", extra, "a JSON object")
            out.append(ActionRecord(kind=cast(ActionKind, self._str(kind, f"{where}'s kind")),
                                    step=self._int(step, "an action's step"),
                                    message=self._str(message, f"{where}'s message"),
                                    details=extra))
        return out

    # -- summary ------------------------------------------------------------------------------
    def process_state(self, info: dict[str, Any]) -> str:
        """For a run marked running: "alive", "gone" (its process ended without closing the
        run) or "unknown" (another host, or no pid recorded)."""
        pid, host = info.get("pid"), info.get("hostname")
        if not isinstance(pid, int) or pid <= 0 or host != socket.gethostname():
            return "unknown"
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "gone"
        except OSError:
            return "alive"  # it exists, owned by someone else
        return "alive"

    def summary(self, top: int = 5) -> dict[str, Any]:
        """The chosen run only (see `runs()` for the others)."""
        meta = self.meta()
        info = self.run_info()
        rows = self.steps()
        losses = [r.get("loss") for r in rows]
        finite = [x for x in losses if x is not None and math.isfinite(x)]
        names = self.param_names()
        _, grads = self.param_grad_norms()
        worst: list[dict[str, Any]] = []
        if grads.size:
            width = min(len(names), grads.shape[1]) if names else grads.shape[1]
            labels = names or [f"#{i}" for i in range(width)]
            nonfinite = (~np.isfinite(grads)).sum(axis=0)
            peak = np.where(np.isfinite(grads), grads, -np.inf).max(axis=0)
            order = sorted(range(width), key=lambda i: (-nonfinite[i], -peak[i]))[:top]
            worst = [{"param": labels[i], "nonfinite_steps": int(nonfinite[i]),
                      "max_grad_norm": float(peak[i]) if math.isfinite(peak[i]) else None}
                     for i in order]
        events = self.events()
        status = info["status"] if self.version >= 2 else meta.get("status", "unknown")
        config = meta.get("config", {})
        notes = []
        if self.wal_unread:
            notes.append("read from read-only media without its write-ahead log: the last "
                         "records of a run that never closed may be missing")
        notes.extend(_resume_notes(meta.get("resumes", [])))
        return {
            "run_dir": str(self.run_dir),
            "run_id": self.run_id,
            "runs": len(self.run_ids),
            "latest_run": self.run_ids[-1],
            "status": status,
            "process": self.process_state(info) if status == "running" else None,
            "pid": info["pid"],
            "started": info["started"],
            "ended": info["ended"],
            "resumed": info["resumed"],
            "store_failed": info["store_failed"],
            "failed_step": info["failed_step"],
            "dropped": info["dropped"],
            "dropped_steps": info["dropped_steps"],
            "trainguard_version": meta.get("trainguard_version"),
            "policy": config.get("policy"),
            "snapshot": meta.get("snapshot"),
            "diagnosis": meta.get("diagnosis", []),
            "preflight": meta.get("preflight", []),
            "steps": len(rows),
            "first_step": rows[0]["step"] if rows else None,
            "last_step": rows[-1]["step"] if rows else None,
            "loss": {
                "first": losses[0] if losses else None,
                "last": losses[-1] if losses else None,
                "min": min(finite) if finite else None,
                "nan": sum(1 for x in losses if x is not None and math.isnan(x)),
                "inf": sum(1 for x in losses if x is not None and math.isinf(x)),
            },
            "verdict": meta.get("verdict"),
            "error": meta.get("error"),
            "eval": meta.get("eval", [])[-1:],
            "lr": lr_summary(rows),
            "grad_norm_nonfinite_steps": sum(
                1 for r in rows if r.get("grad_norm") is not None
                and not math.isfinite(r["grad_norm"])),
            "actions": dict(Counter(r.get("action", "?") for r in rows)),
            "interventions": dict(Counter(a.kind for a in self.actions())),
            "events_by_kind": dict(Counter(e.kind for e in events)),
            "events": [e.to_dict() for e in events],
            "worst_params": worst,
            "notes": notes,
        }


def _merge_note(run: dict[str, Any], note: dict[str, Any]) -> None:
    """What the run's writer could only leave in the lock file (a full disk refused the store):
    its store failure, what it dropped and, for a run the store still shows running, how it
    closed."""
    if isinstance(note.get("store_failed"), str):
        run["store_failed"] = note["store_failed"]
    if isinstance(note.get("failed_step"), int):
        run["failed_step"] = note["failed_step"]
    for key in ("dropped", "dropped_steps"):
        if isinstance(note.get(key), int):
            run[key] = max(run[key], note[key])
    if run["status"] == "running" and isinstance(note.get("status"), str):
        run["status"] = note["status"]
        ended = note.get("ended")
        if isinstance(ended, (int, float)):
            run["ended"] = float(ended)


def _id_ranges(ids: list[int]) -> str:
    if not ids:
        return "none"
    if ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 2:
        return f"{ids[0]}..{ids[-1]}"
    return ", ".join(str(i) for i in ids)


def lr_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per parameter group: the first, last, lowest and highest LR, and its largest rise from
    one step to the next (a user's LR change shows here)."""
    series: list[list[tuple[int, float]]] = []
    for row in rows:
        lrs = row.get("lrs")
        if lrs is None:
            lrs = [row.get("lr")]
        for group, value in enumerate(lrs):
            if value is None or not math.isfinite(value):
                continue
            while len(series) <= group:
                series.append([])
            series[group].append((row["step"], float(value)))
    out = []
    for points in series:
        values = [v for _, v in points]
        rises = [(b[1] / a[1], b[0]) for a, b in pairwise(points) if a[1] > 0]
        ratio, at = max(rises, default=(1.0, None))
        out.append({"first": values[0] if values else None, "last": values[-1] if values else None,
                    "min": min(values, default=None), "max": max(values, default=None),
                    "largest_rise": {"ratio": ratio, "step": at} if ratio > 1.0 else None})
    return out


def _resume_notes(resumes: Any) -> list[str]:
    """What `summary` notes of each time the run was resumed: what ended the process before,
    and where steps counted again were stored."""
    notes = []
    for resume in resumes if isinstance(resumes, list) else []:
        if not isinstance(resume, dict):
            continue
        after = resume.get("after")
        if isinstance(after, str) and isinstance(resume.get("at"), int):
            notes.append(f"resumed at step {resume['at']} after the process before it "
                         f"ended by {after}")
        if all(isinstance(resume.get(k), int) for k in ("at", "counted_from", "offset")) \
                and resume["offset"] > 0:
            notes.append(f"resumed at step {resume['at']}: that process counted its steps "
                         f"from {resume['counted_from']}, so they are stored "
                         f"{resume['offset']} later, after the steps already recorded "
                         f"(which are kept)")
    return notes
