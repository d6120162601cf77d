"""The run store's files and its lock file's note: what the writer and the reader both need.

Kept apart from `writer.py` so that reading a store (`RunReader`, `trainguard analyze`, the HTML
report) imports no writer thread and no sink."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

DB_NAME = "trainguard.db"
LOCK_NAME = "trainguard.lock"
SQLITE_HEADER = b"SQLite format 3\x00"

NOTE_MAX = 2048
"""Bytes of a lock file's note: well within the block the lock file already has on disk."""


def write_note(fd: int, note: dict[str, Any]) -> None:
    """Append `note` (one JSON line) after the holder line of the lock file open as `fd`,
    rewriting bytes the file already has where it can: on a full disk, nothing else can be
    written."""
    if fd < 0:
        return
    for key in ("store_failed",):
        if isinstance(note.get(key), str) and len(note[key]) > 300:
            note[key] = note[key][:297] + "..."
    line = (json.dumps(note, allow_nan=False, default=str) + "\n").encode()[:NOTE_MAX]
    try:
        head = os.pread(fd, 256, 0).split(b"\n", 1)[0] + b"\n"
        os.pwrite(fd, head + line, 0)
        os.ftruncate(fd, len(head) + len(line))
    except OSError:
        pass  # nowhere left to say it: the log has it


def read_note(lock_path: Path) -> dict[str, Any] | None:
    """The note a writer left in a lock file (`write_note`), or None."""
    try:
        with open(lock_path, "rb") as handle:
            text = handle.read(256 + NOTE_MAX).decode("utf-8", errors="replace")
        lines = text.splitlines()
        note = json.loads(lines[1]) if len(lines) > 1 else None
    except (OSError, ValueError):
        return None
    return note if isinstance(note, dict) else None


def read_holder(lock_path: Path) -> int | None:
    """The pid written in a lock file by the writer that holds it (None when unknown)."""
    try:
        text = lock_path.read_text(encoding="utf-8", errors="replace")
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return None
