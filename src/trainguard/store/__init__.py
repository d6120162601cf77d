"""The embedded run store: one SQLite file per run directory, one row per run in it, written off
the hot path.

The names below load on first use (PEP 562, as in `trainguard`): reading a store
(`trainguard.store.reader`, `trainguard analyze`, the HTML report) imports no writer thread and
no sink."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainguard.lazy import lazy_exports

if TYPE_CHECKING:
    from trainguard.store.files import DB_NAME, LOCK_NAME
    from trainguard.store.reader import RunReader
    from trainguard.store.sink import RunStoreSink
    from trainguard.store.writer import RunStore

_LAZY: dict[str, str] = {
    "DB_NAME": "trainguard.store.files", "LOCK_NAME": "trainguard.store.files",
    "RunReader": "trainguard.store.reader", "RunStoreSink": "trainguard.store.sink",
    "RunStore": "trainguard.store.writer",
}

__all__ = ["DB_NAME", "LOCK_NAME", "RunReader", "RunStore", "RunStoreSink"]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
