"""A store that fails mid-run: reported once, records dropped and counted, training untouched,
and `show` says so."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import torch

from trainguard import Guard, GuardConfig, RunReader, TrainingDiverged
from trainguard.cli import main
from trainguard.store import RunStore, RunStoreSink

from .helpers import run_info, step_report


def test_a_writer_that_fails_mid_run(tmp_path: Path, monkeypatch, caplog, capsys) -> None:
    sink = RunStoreSink(tmp_path)
    sink.on_run_start(run_info(tmp_path))
    for step in range(5):
        sink.on_step(step_report(step))
    sink.store.flush()

    def no_space(self: RunStore, batch: list[tuple]) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(RunStore, "_write", no_space)
    with caplog.at_level(logging.ERROR, logger="trainguard"):
        for step in range(5, 25):
            sink.on_step(step_report(step))  # never raises
            if step == 5:
                sink.store.flush()
        dropped_before_close = sink.store.dropped
        sink.on_run_end("finished")
        sink.close()
    assert sink.store.failed == "OSError: [Errno 28] No space left on device"
    assert dropped_before_close >= 20 - 1, "every record after the failure is counted"
    assert sink.store.dropped == dropped_before_close + 1, "the status update is counted too"
    reports = [r for r in caplog.records if "stopped writing" in r.getMessage()]
    assert len(reports) == 1, "reported once"
    assert str(tmp_path) in reports[0].getMessage()

    with RunReader(tmp_path) as reader:
        summary = reader.summary()
    assert summary["steps"] == 5
    assert summary["store_failed"] == sink.store.failed and summary["failed_step"] == 5
    assert summary["dropped"] == sink.store.dropped
    assert main(["show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (f"store      stopped writing at step 5: OSError: [Errno 28] No space left on "
            f"device; 20 steps not recorded ({sink.store.dropped} records dropped)") in out
    assert main(["runs", str(tmp_path)]) == 0
    assert "store stopped writing, 20 steps lost" in capsys.readouterr().out


def _fill_up(store: RunStore) -> None:
    """The database may not grow by another page: SQLite's own "database or disk is full"."""
    store.flush()
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages}")


def test_a_full_disk_counts_every_lost_step_and_closes_the_run_honestly(
        tmp_path: Path, caplog, capsys) -> None:
    sink = RunStoreSink(tmp_path)
    sink.on_run_start(run_info(tmp_path))
    for step in range(5):
        sink.on_step(step_report(step))
    _fill_up(sink.store)
    with caplog.at_level(logging.ERROR, logger="trainguard"):
        for step in range(5, 3005):
            sink.on_step(step_report(step))
        sink.on_run_end("finished")
        sink.close()
    store = sink.store
    assert "database or disk is full" in (store.failed or "")
    assert store.dropped_steps > 0
    with RunReader(tmp_path) as reader:
        summary = reader.summary()
    stored = summary["steps"]
    assert stored + store.dropped_steps == 3005, "every step is stored or counted as lost"
    assert summary["status"] == "finished", "closed as it was, not 'killed'"
    assert summary["process"] is None
    assert summary["dropped_steps"] == store.dropped_steps
    assert summary["dropped"] == store.dropped
    messages = [r.getMessage() for r in caplog.records]
    assert sum("stopped writing" in m for m in messages) == 1, "the failure is reported once"
    assert sum("were not recorded" in m for m in messages) == 1, "and the loss once, at close"
    assert main(["show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "killed" not in out
    assert f"{store.dropped_steps} steps not recorded" in out


class _Refusing:
    """A connection on a disk that takes nothing more, not even the failure note."""

    def __init__(self, conn) -> None:
        self.conn = conn

    def execute(self, sql: str, *args):
        if sql.startswith(("BEGIN", "ROLLBACK")):
            return self.conn.execute(sql, *args)
        raise sqlite3.OperationalError("database or disk is full")

    def executemany(self, sql: str, *args):
        raise sqlite3.OperationalError("database or disk is full")

    def close(self) -> None:
        self.conn.close()


def test_when_the_store_takes_nothing_the_lock_file_keeps_the_close(tmp_path: Path,
                                                                    capsys) -> None:
    sink = RunStoreSink(tmp_path)
    sink.on_run_start(run_info(tmp_path))
    for step in range(5):
        sink.on_step(step_report(step))
    sink.store.flush()
    sink.store._conn = _Refusing(sink.store._conn)
    for step in range(5, 205):
        sink.on_step(step_report(step))
    sink.on_run_end("finished")
    sink.close()
    with RunReader(tmp_path) as reader:
        summary = reader.summary()
    assert summary["status"] == "finished" and summary["process"] is None
    assert summary["store_failed"] == "OperationalError: database or disk is full"
    assert summary["failed_step"] == 5 and summary["dropped_steps"] == 200
    assert main(["show", str(tmp_path)]) == 0
    assert "killed" not in capsys.readouterr().out
    # the next writer in the directory moves the note into the store before it is overwritten
    RunStore(tmp_path).close()
    with RunReader(tmp_path, run=1) as reader:
        info = reader.run_info()
    assert info["status"] == "finished" and info["dropped_steps"] == 200


def test_a_halt_on_a_full_disk_records_the_store_failure(tmp_path: Path, capsys) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = Guard(model, optimizer, config=GuardConfig(policy="halt", sinks={"console": False}),
                  run_dir=tmp_path)
    x = torch.randn(8, 4)
    for step in range(30):
        if step == 10:
            assert guard.run.store is not None
            _fill_up(guard.run.store)
        loss = model(x).pow(2).mean() * (float("nan") if step == 25 else 1.0)
        loss.backward()
        try:
            guard.step(loss)
        except TrainingDiverged:
            break
        optimizer.zero_grad()
    else:
        raise AssertionError("the NaN halts the run")
    with RunReader(tmp_path) as reader:
        summary = reader.summary()
    assert summary["status"] == "halted"
    assert "disk is full" in (summary["store_failed"] or "")
    assert summary["dropped_steps"] >= 1
    assert summary["steps"] + summary["dropped_steps"] == 26
