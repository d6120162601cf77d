"""Tables of the run store.

One `trainguard.db` per run directory holds every run started in that directory. The `runs` table
has one row per run (when it started and ended, its status, the process that wrote it, whether the
store stopped writing and how many records, and steps, it dropped); every other table is keyed by
`run_id`, so runs never mix. `runs.dropped_steps` was added to version 2 later: a writer adds it
to an older version 2 store, and the reader reads 0 where it is missing.

Scalars are JSON (Python's encoder writes NaN and Infinity literally, so nothing is lost);
per-parameter and per-module vectors are float32 blobs, which keep NaN and inf bit for bit.

Schema versions (`PRAGMA user_version`):

- 1: one run per directory, no `runs` table and no `run_id` (version stored in meta).
  `RunReader` reads such a store as a single run, id 1, and leaves the file untouched.
- 2: the current one. Opening a version 1 store for writing migrates it in place, inside one
  transaction (all or nothing): its data becomes run 1, and the new run gets id 2 (or, with
  `resume=True`, continues run 1).
"""

from __future__ import annotations

import json
import sqlite3
import time

SCHEMA_VERSION = 2

RUN_TABLES = ("meta", "steps", "param_metrics", "module_metrics", "events", "actions")
"""The per-run tables of version 2 (each has a `run_id` column)."""

V1_TABLES = frozenset({"meta", "steps", "param_metrics", "module_metrics", "events"})

SCHEMA = """
CREATE TABLE runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, started REAL NOT NULL, ended REAL,
    status TEXT NOT NULL, pid INTEGER, hostname TEXT, resumed INTEGER NOT NULL DEFAULT 0,
    store_failed TEXT, failed_step INTEGER, dropped INTEGER NOT NULL DEFAULT 0,
    dropped_steps INTEGER NOT NULL DEFAULT 0);
CREATE TABLE meta (
    run_id INTEGER NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (run_id, key));
CREATE TABLE steps (
    run_id INTEGER NOT NULL, step INTEGER NOT NULL, time REAL NOT NULL, data TEXT NOT NULL,
    grad_norms BLOB, PRIMARY KEY (run_id, step));
CREATE TABLE param_metrics (
    run_id INTEGER NOT NULL, step INTEGER NOT NULL, metric TEXT NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (run_id, step, metric));
CREATE TABLE module_metrics (
    run_id INTEGER NOT NULL, step INTEGER NOT NULL, metric TEXT NOT NULL, names TEXT NOT NULL,
    data BLOB NOT NULL, PRIMARY KEY (run_id, step, metric));
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER NOT NULL, step INTEGER NOT NULL,
    kind TEXT NOT NULL, severity TEXT NOT NULL, param TEXT, value TEXT, message TEXT NOT NULL,
    details TEXT NOT NULL);
CREATE INDEX events_run_step ON events (run_id, step);
CREATE TABLE actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER NOT NULL, step INTEGER NOT NULL,
    kind TEXT NOT NULL, message TEXT NOT NULL, details TEXT NOT NULL);
CREATE INDEX actions_run_step ON actions (run_id, step);
"""

V2_TABLES = frozenset({"runs", *RUN_TABLES})


def store_version(conn: sqlite3.Connection) -> int | None:
    """1 or 2 for a trainguard store, 0 for an empty database, None for anything else."""
    tables = {row[0] for row in conn.execute(
        "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")}
    if not tables:
        return 0
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if V2_TABLES <= tables and version == SCHEMA_VERSION:
        return SCHEMA_VERSION
    if V1_TABLES <= tables and "runs" not in tables and version == 0:
        return 1
    if version > SCHEMA_VERSION and "runs" in tables:
        return version  # written by a newer trainguard: callers refuse it by number
    return None


def migrate_v1(conn: sqlite3.Connection) -> None:
    """Turn a version 1 store into version 2, its data becoming run 1. The caller holds the
    transaction, so a failure leaves the version 1 store as it was."""
    status = "unknown"
    row = conn.execute("SELECT value FROM meta WHERE key = 'status'").fetchone()
    if row is not None:
        try:
            loaded = json.loads(row[0])
        except (ValueError, TypeError, RecursionError):  # a hostile or odd status: no status
            loaded = None
        status = loaded if isinstance(loaded, str) else status
    first, last = conn.execute("SELECT min(time), max(time) FROM steps").fetchone()
    for table in V1_TABLES:
        conn.execute(f"ALTER TABLE {table} RENAME TO v1_{table}")
    conn.execute("DROP INDEX IF EXISTS events_step")
    for statement in SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    started = first if first is not None else time.time()
    conn.execute("INSERT INTO runs (id, started, ended, status) VALUES (1, ?, ?, ?)",
                 (started, None if status == "running" else last, status))
    conn.execute("INSERT INTO meta SELECT 1, key, value FROM v1_meta "
                 "WHERE key != 'schema_version'")
    conn.execute("INSERT INTO steps SELECT 1, step, time, data, grad_norms FROM v1_steps")
    conn.execute("INSERT INTO param_metrics SELECT 1, step, metric, data FROM v1_param_metrics")
    conn.execute("INSERT INTO module_metrics SELECT 1, step, metric, names, data "
                 "FROM v1_module_metrics")
    conn.execute("INSERT INTO events (run_id, step, kind, severity, param, value, message, "
                 "details) SELECT 1, step, kind, severity, param, value, message, details "
                 "FROM v1_events ORDER BY id")
    for table in V1_TABLES:
        conn.execute(f"DROP TABLE v1_{table}")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def add_columns(conn: sqlite3.Connection) -> None:
    """Columns added to version 2 after it shipped (readers of version 2 ignore them; this one
    reads a store without them): `runs.dropped_steps`."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    if "dropped_steps" not in columns:
        conn.execute("ALTER TABLE runs ADD COLUMN dropped_steps INTEGER NOT NULL DEFAULT 0")


def create(conn: sqlite3.Connection) -> None:
    """Create the version 2 tables in an empty database (inside the caller's transaction)."""
    for statement in SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
