"""Reading a store: verdicts in the words of the version that wrote them."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from trainguard import RunReader
from trainguard.run_verdict import RunVerdict
from trainguard.store import DB_NAME, RunStoreSink

from .helpers import run_info, step_report


def _run_with_verdict(run_dir: Path, word: str) -> None:
    """A store whose verdict says `word`, as a writer that used that word left it."""
    sink = RunStoreSink(run_dir)
    sink.on_run_start(run_info(run_dir))
    for step in range(3):
        sink.on_step(step_report(step, loss=1.0))
    sink.on_verdict(RunVerdict("degraded", "the loss ended at 3, above the 1 it was before",
                               1.0, 1.0, 3.0, 1))
    sink.on_run_end("finished")
    sink.close()
    with sqlite3.connect(run_dir / DB_NAME) as db:
        value = json.loads(db.execute("SELECT value FROM meta WHERE key = 'verdict'").fetchone()[0])
        db.execute("UPDATE meta SET value = ? WHERE key = 'verdict'",
                   (json.dumps({**value, "verdict": word}),))


@pytest.mark.parametrize("written, read", [("diverged", "degraded"),
                                           ("spike-recovered", "recovered"),
                                           ("stalled", "stalled")])
def test_a_verdict_in_older_words_reads_in_todays(tmp_path: Path, written: str,
                                                  read: str) -> None:
    _run_with_verdict(tmp_path, written)
    with RunReader(tmp_path) as reader:
        assert reader.meta()["verdict"]["verdict"] == read
        assert reader.meta()["verdict"]["message"].startswith("the loss ended at 3")
        assert [run["verdict"] for run in reader.runs()] == [read]
