"""The embedded run store: one SQLite file per run directory, one row per run in it, written off
the hot path."""

from trainguard.store.reader import RunReader
from trainguard.store.sink import RunStoreSink
from trainguard.store.writer import DB_NAME, LOCK_NAME, RunStore

__all__ = ["DB_NAME", "LOCK_NAME", "RunReader", "RunStore", "RunStoreSink"]
