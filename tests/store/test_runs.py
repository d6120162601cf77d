"""Runs kept apart: a run directory reused by a second run, resume, version 1 stores, and
directory names that look like URI syntax."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from trainguard import RunReader, StoreError
from trainguard.cli import main
from trainguard.events import Event, RunError
from trainguard.store import DB_NAME, RunStore, RunStoreSink, schema

from .helpers import cli, listing, run_info, step_report


def record(run_dir: Path, steps: int, *, loss: float, status: str = "finished",
           resume: bool = False, events: int = 0) -> int:
    sink = RunStoreSink(run_dir, resume=resume)
    sink.on_run_start(run_info(run_dir))
    for step in range(steps):
        found = [Event("loss_spike", step, "warning", f"spike {step}")] if step < events else []
        for event in found:
            sink.on_event(event)
        sink.on_step(step_report(step, loss=loss, events=found))
    sink.on_run_end(status)
    sink.close()
    return sink.run_id


def test_a_reused_run_directory_keeps_its_runs_apart(tmp_path: Path, capsys) -> None:
    assert record(tmp_path, 5, loss=9.0, status="halted", events=2) == 1
    assert record(tmp_path, 3, loss=1.0) == 2

    with RunReader(tmp_path) as latest:
        assert latest.run_id == 2 and latest.run_ids == [1, 2]
        assert [r["step"] for r in latest.steps()] == [0, 1, 2]
        assert latest.events() == [] and latest.meta()["status"] == "finished"
        summary = latest.summary()
        assert summary["steps"] == 3 and summary["loss"]["first"] == 1.0
        assert summary["run_id"] == 2 and summary["runs"] == 2 and summary["status"] == "finished"
        runs = latest.runs()
    assert [(r["id"], r["status"], r["steps"], r["events"], r["last_step"]) for r in runs] == [
        (1, "halted", 5, 2, 4), (2, "finished", 3, 0, 2)]
    assert all(r["ended"] >= r["started"] for r in runs)
    with RunReader(tmp_path, run=1) as first:
        assert first.summary()["loss"]["first"] == 9.0 and len(first.events()) == 2
        assert first.meta()["status"] == "halted"

    assert main(["show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "run 2 of 2 in this directory; earlier runs: trainguard runs" in out
    assert "steps      3 recorded (0..2)" in out and "status     finished" in out
    assert "spike" not in out, "the earlier run's events are not mixed in"
    assert main(["show", str(tmp_path), "--run", "1"]) == 0
    out = capsys.readouterr().out
    assert "run 1 of 2" in out and "steps      5 recorded (0..4)" in out and "halted" in out
    assert main(["runs", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split()[0] == "1" and "halted" in lines[2]
    assert lines[3].split()[0] == "2" and "finished" in lines[3]
    assert main(["runs", str(tmp_path), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in listed] == [1, 2] and listed[0]["events"] == 2


def test_an_unknown_run_id_is_one_clear_error(tmp_path: Path, capsys) -> None:
    record(tmp_path, 2, loss=1.0)
    with pytest.raises(StoreError, match=r"no run 7 in .*its runs: 1"):
        RunReader(tmp_path, run=7)
    assert main(["show", str(tmp_path), "--run", "7"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainguard: error: no run 7") and err.count("\n") == 1


def test_resume_continues_the_latest_run(tmp_path: Path) -> None:
    record(tmp_path, 3, loss=2.0, status="interrupted")
    store = RunStore(tmp_path, resume=True)
    assert store.run_id == 1 and store.resumed
    for step in (3, 4):
        store.put_step(step, {"loss": 1.0, "action": "applied"}, np.zeros(3))
    store.set_status("finished")
    store.close()
    with RunReader(tmp_path) as reader:
        assert reader.run_ids == [1]
        assert [r["step"] for r in reader.steps()] == [0, 1, 2, 3, 4]
        [run] = reader.runs()
        assert run["resumed"] == 1 and run["status"] == "finished"


def test_resume_in_an_empty_directory_starts_run_1(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "new", resume=True)
    assert store.run_id == 1 and not store.resumed
    store.close()


def _write_v1_store(path: Path) -> None:
    """A store as the first release wrote it: one run, no runs table."""
    conn = sqlite3.connect(path / DB_NAME)
    conn.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE steps (step INTEGER PRIMARY KEY, time REAL NOT NULL, data TEXT NOT NULL,
                            grad_norms BLOB);
        CREATE TABLE param_metrics (step INTEGER NOT NULL, metric TEXT NOT NULL,
                                    data BLOB NOT NULL, PRIMARY KEY (step, metric));
        CREATE TABLE module_metrics (step INTEGER NOT NULL, metric TEXT NOT NULL,
                                     names TEXT NOT NULL, data BLOB NOT NULL,
                                     PRIMARY KEY (step, metric));
        CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, step INTEGER NOT NULL,
                             kind TEXT NOT NULL, severity TEXT NOT NULL, param TEXT, value TEXT,
                             message TEXT NOT NULL, details TEXT NOT NULL);
        CREATE INDEX events_step ON events (step);
    """)
    conn.executemany("INSERT INTO meta VALUES (?, ?)", [
        ("schema_version", "1"), ("status", '"finished"'), ("param_names", '["a", "b"]'),
        ("config", '{"policy": "protect"}')])
    blob = np.array([0.5, np.nan], dtype="<f4").tobytes()
    conn.executemany("INSERT INTO steps VALUES (?, ?, ?, ?)", [
        (step, 1000.0 + step, json.dumps({"loss": 3.0 - step, "action": "applied"}), blob)
        for step in range(4)])
    conn.execute("INSERT INTO events (step, kind, severity, param, value, message, details) "
                 "VALUES (2, 'loss_spike', 'warning', NULL, 'NaN', 'old spike', '{}')")
    conn.commit()
    conn.close()


def test_a_version_1_store_reads_as_run_1(tmp_path: Path, capsys) -> None:
    _write_v1_store(tmp_path)
    before = (tmp_path / DB_NAME).read_bytes()
    with RunReader(tmp_path) as reader:
        assert reader.version == 1 and reader.run_id == 1 and reader.run_ids == [1]
        summary = reader.summary()
        assert summary["steps"] == 4 and summary["status"] == "finished"
        assert summary["events_by_kind"] == {"loss_spike": 1}
        assert reader.runs()[0]["steps"] == 4
        _, grads = reader.param_grad_norms()
        assert grads.shape == (4, 2)
    assert main(["show", str(tmp_path)]) == 0
    assert "run 1 of 1 in this directory" in capsys.readouterr().out
    assert (tmp_path / DB_NAME).read_bytes() == before, "reading never changes a store"


def test_writing_into_a_version_1_store_migrates_it_to_run_1(tmp_path: Path) -> None:
    _write_v1_store(tmp_path)
    assert record(tmp_path, 2, loss=0.5) == 2
    with RunReader(tmp_path, run=1) as old:
        assert old.version == schema.SCHEMA_VERSION
        assert [r["loss"] for r in old.steps()] == [3.0, 2.0, 1.0, 0.0]
        assert old.meta()["status"] == "finished" and old.events()[0].message == "old spike"
        assert "schema_version" not in old.meta()
    with RunReader(tmp_path) as new:
        assert new.run_id == 2 and len(new.steps()) == 2 and new.events() == []


def test_a_failed_migration_leaves_the_version_1_store_as_it_was(tmp_path: Path,
                                                                  monkeypatch) -> None:
    _write_v1_store(tmp_path)

    def half_way(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE steps RENAME TO v1_steps")
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(schema, "migrate_v1", half_way)
    with pytest.raises(StoreError, match="disk I/O error"):
        RunStore(tmp_path)
    with RunReader(tmp_path) as reader:
        assert reader.version == 1 and len(reader.steps()) == 4


@pytest.mark.parametrize("name", ["run#1", "what?x=1", "100%25done", "a #?%b"])
def test_directory_names_that_look_like_uri_syntax(tmp_path: Path, name: str, capsys) -> None:
    run_dir = tmp_path / name
    record(run_dir, 3, loss=1.0)
    record(run_dir, 2, loss=0.5)
    assert listing(tmp_path) <= {name, *(f"{name}/{f}" for f in
                                         ("trainguard.db", "trainguard.db-wal",
                                          "trainguard.db-shm", "trainguard.lock"))}
    with RunReader(run_dir) as reader:
        assert reader.run_ids == [1, 2] and len(reader.steps()) == 2
    assert main(["show", str(run_dir)]) == 0
    assert "steps      2 recorded" in capsys.readouterr().out
    result = cli("show", str(run_dir), "--run", "1")
    assert result.returncode == 0, result.stderr
    assert "steps      3 recorded" in result.stdout
    assert {p.name for p in tmp_path.iterdir()} == {name}, "no stray files next to the run"


def test_resume_without_the_guards_state_continues_after_the_stored_steps(tmp_path: Path,
                                                                          capsys) -> None:
    record(tmp_path, 5, loss=9.0, status="interrupted", events=1)
    # a second process resumes but counts from 0 again (no load_state_dict)
    record(tmp_path, 3, loss=1.0, resume=True, events=1)
    with RunReader(tmp_path) as reader:
        assert reader.run_ids == [1]
        rows = reader.steps()
        assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5, 6, 7]
        assert [r["loss"] for r in rows] == [9.0] * 5 + [1.0] * 3, "the first process's rows stay"
        assert [e.step for e in reader.events()] == [0, 5]
        summary = reader.summary()
        assert summary["loss"]["first"] == 9.0 and summary["loss"]["last"] == 1.0
        assert summary["resumed"] == 1
    assert main(["show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "resumed at step 5: that process counted its steps from 0" in out


def test_resume_from_an_older_checkpoint_keeps_the_steps_after_it(tmp_path: Path) -> None:
    record(tmp_path, 10, loss=9.0, status="interrupted")
    store = RunStore(tmp_path, resume=True)  # restarted from a checkpoint of step 6
    for step in (6, 7):
        store.put_step(step, {"loss": 1.0}, np.zeros(3))
    store.close()
    with RunReader(tmp_path) as reader:
        rows = reader.steps()
        assert [r["step"] for r in rows] == list(range(12))
        assert [r["loss"] for r in rows[:10]] == [9.0] * 10
        assert [r["loss"] for r in rows[10:]] == [1.0, 1.0]
        [resume] = reader.meta()["resumes"]
        assert (resume["at"], resume["counted_from"], resume["offset"]) == (10, 6, 4)


def test_a_run_resumed_after_ctrl_c_that_finishes_is_finished(tmp_path: Path, capsys) -> None:
    """The Ctrl-C ended the first process, not the run the second one finished: `show` says
    finished, and when it was resumed and why."""
    sink = RunStoreSink(tmp_path)
    sink.on_run_start(run_info(tmp_path))
    for step in range(5):
        sink.on_step(step_report(step, loss=2.0))
    sink.on_run_error(RunError(type="KeyboardInterrupt", message=""))
    sink.on_run_end("interrupted")
    sink.close()
    record(tmp_path, 3, loss=1.0, resume=True)
    with RunReader(tmp_path) as reader:
        summary = reader.summary()
        assert summary["status"] == "finished" and summary["error"] is None
        [resume] = reader.meta()["resumes"]
        assert resume["after"] == "KeyboardInterrupt"
    assert main(["show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "finished by" not in out
    assert "resumed at step 5 after the process before it ended by KeyboardInterrupt" in out
    assert main(["runs", str(tmp_path)]) == 0
    assert "ended by" not in capsys.readouterr().out
