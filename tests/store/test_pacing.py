"""The writer's pace bounds what a SIGKILL loses: a step returns only when at most
`MAX_UNCOMMITTED_STEPS` steps (none older than `MAX_UNCOMMITTED_S`) wait to be committed; a
stalled writer delays a step by at most `MAX_WAIT_S`, once, and training goes on."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from benchmarks import kill_trials
from trainguard.store import RunStore, writer


def _step(store: RunStore, step: int) -> None:
    store.put_step(step, {"loss": 1.0}, np.ones(3))


def test_a_slow_writer_is_waited_for(tmp_path: Path, monkeypatch) -> None:
    write = RunStore._write

    def slow(self: RunStore, batch: list[tuple]) -> None:
        time.sleep(0.02)  # a writer that needs longer than the steps take
        write(self, batch)

    monkeypatch.setattr(RunStore, "_write", slow)
    store = RunStore(tmp_path)
    try:
        for step in range(60):
            _step(store, step)
            assert store._steps_put - store._steps_done <= writer.MAX_UNCOMMITTED_STEPS
    finally:
        store.close()


def test_an_old_uncommitted_step_is_waited_for(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(writer, "COMMIT_INTERVAL_S", 10.0)  # the writer would sleep on
    store = RunStore(tmp_path)
    try:
        _step(store, 0)
        time.sleep(writer.MAX_UNCOMMITTED_S + 0.05)
        _step(store, 1)  # step 0 is too old: committed before this returns
        assert store._steps_done >= 1
    finally:
        store.close()


def test_a_stalled_writer_delays_one_step_and_is_reported_once(tmp_path: Path, monkeypatch,
                                                               caplog) -> None:
    write = RunStore._write

    def stalled(self: RunStore, batch: list[tuple]) -> None:
        time.sleep(1.5)
        write(self, batch)

    monkeypatch.setattr(RunStore, "_write", stalled)
    store = RunStore(tmp_path)
    try:
        with caplog.at_level(logging.WARNING, logger="trainguard"):
            took = []
            for step in range(40):
                start = time.monotonic()
                _step(store, step)
                took.append(time.monotonic() - start)
        assert max(took) < writer.MAX_WAIT_S + 0.2
        assert sum(t > 0.1 for t in took) == 1, "waited once, then not until it catches up"
        assert sum("cannot keep up" in r.getMessage() for r in caplog.records) == 1
    finally:
        store.close()
    assert store._steps_done == 40, "nothing was lost by not waiting"


def test_sigkill_loses_at_most_the_documented_steps() -> None:
    result = kill_trials.run("sigkill", 8, step_ms=1.0, max_delay=0.3, seed=2)
    lost = [trial["lost"] for trial in result["trials"]]
    assert len(lost) == 8
    assert max(lost) <= writer.MAX_UNCOMMITTED_STEPS, lost
