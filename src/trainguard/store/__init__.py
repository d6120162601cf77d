"""The embedded run store: one SQLite file per run directory, written off the hot path."""

from trainguard.store.reader import RunReader
from trainguard.store.writer import DB_NAME, RunStore

__all__ = ["DB_NAME", "RunReader", "RunStore"]
