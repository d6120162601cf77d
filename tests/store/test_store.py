"""The run store: round trip, NaN kept, crash safety under SIGKILL, failures that go unnoticed
by training."""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from trainguard import RunReader, StoreError
from trainguard.events import ActionRecord, Event
from trainguard.store import DB_NAME, RunStore

from .helpers import child_env, cli


def test_a_step_without_a_loss_is_no_nan(tmp_path: Path) -> None:
    """A policy-gradient loop hands no loss: those steps are missing from the curve, a NaN loss
    stays a NaN."""
    store = RunStore(tmp_path)
    store.put_meta("param_names", ["a"])
    store.put_step(0, {"loss": None, "grad_norm": 0.3, "action": "applied"}, np.array([0.3]))
    store.put_step(1, {"loss": math.nan, "grad_norm": 0.3, "action": "applied"}, np.array([0.3]))
    store.put_step(2, {"loss": None, "grad_norm": 0.3, "action": "applied"}, np.array([0.3]))
    store.close()
    steps, loss = RunReader(tmp_path).scalar("loss")
    assert list(steps) == [1] and math.isnan(loss[0])
    assert list(RunReader(tmp_path).scalar("grad_norm")[0]) == [0, 1, 2]


def test_round_trip_keeps_nan_and_inf(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    assert store.run_id == 1
    store.put_meta("param_names", ["a", "b", "c"])
    store.put_step(0, {"loss": 1.5, "grad_norm": 0.3, "action": "applied"},
                   np.array([0.1, 0.2, 0.3]))
    store.put_step(1, {"loss": math.nan, "grad_norm": math.inf, "action": "skipped"},
                   np.array([math.nan, math.inf, -math.inf]))
    store.put_param_metrics(1, {"weight_maxabs": np.array([1.0, math.nan, 3.0])})
    store.put_module_metrics(1, ["m1", "m2"], {"act_maxabs": np.array([math.inf, 2.0])})
    store.put_event(Event("nonfinite_loss", 1, "error", "loss is nan", value=math.nan))
    store.put_action(ActionRecord("skip", 1, "skipped the update", {"reason": "nan"}))
    store.set_status("finished")
    store.close()

    reader = RunReader(tmp_path)
    assert reader.run_id == 1 and reader.meta()["status"] == "finished"
    steps, loss = reader.scalar("loss")
    assert list(steps) == [0, 1] and loss[0] == 1.5 and math.isnan(loss[1])
    assert math.isinf(reader.steps()[1]["grad_norm"])
    _, grads = reader.param_grad_norms()
    assert math.isnan(grads[1, 0]) and grads[1, 1] == math.inf and grads[1, 2] == -math.inf
    _, wmax = reader.param_metric("weight_maxabs")
    assert math.isnan(wmax[0, 1])
    [(step, names, values)] = reader.module_metric("act_maxabs")
    assert step == 1 and names == ["m1", "m2"] and values[0] == math.inf
    [event] = reader.events()
    assert event.kind == "nonfinite_loss" and math.isnan(event.value)
    [action] = reader.actions()
    assert action == ActionRecord("skip", 1, "skipped the update", {"reason": "nan"})
    summary = reader.summary()
    assert summary["loss"]["nan"] == 1 and summary["grad_norm_nonfinite_steps"] == 1
    assert summary["worst_params"][0]["nonfinite_steps"] == 1
    assert summary["interventions"] == {"skip": 1}
    assert summary["run_id"] == 1 and summary["runs"] == 1
    assert summary["store_failed"] is None and summary["dropped"] == 0
    assert summary["ended"] is not None and summary["ended"] >= summary["started"]



def test_events_are_read_in_step_order(tmp_path: Path) -> None:
    """An event can be recorded after a later step's (a sampled step's heavy probes are read a
    step later, the last ones at the close): the reader lists them by step, each step's in the
    order they were recorded."""
    store = RunStore(tmp_path)
    for step, kind in ((3, "loss_spike"), (3, "grad_explosion"), (2, "update_too_large"),
                       (5, "nonfinite_loss"), (4, "nonfinite_weight")):
        store.put_event(Event(kind, step, "warning", kind))
    store.set_status("finished")
    store.close()
    with RunReader(tmp_path) as reader:
        assert [(e.step, e.kind) for e in reader.events()] == [
            (2, "update_too_large"), (3, "loss_spike"), (3, "grad_explosion"),
            (4, "nonfinite_weight"), (5, "nonfinite_loss")]

def test_reader_rejects_missing_and_corrupt_directories(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no run directory"):
        RunReader(tmp_path / "missing")
    with pytest.raises(StoreError, match="not a trainguard run"):
        RunReader(tmp_path)
    (tmp_path / DB_NAME).write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="corrupt or not a trainguard store"):
        RunReader(tmp_path)
    file_path = tmp_path / "file"
    file_path.write_text("x")
    with pytest.raises(StoreError, match="not a directory"):
        RunReader(file_path)


CHILD = textwrap.dedent("""
    import sys, time
    from trainguard.store import RunStoreSink
    sys.path.insert(0, {tests!r})
    from store.helpers import run_info, step_report
    sink = RunStoreSink({run_dir!r})
    sink.on_run_start(run_info({run_dir!r}))
    for step in range(100000):
        sink.on_step(step_report(step, loss=2.0 / (1 + step)))
        print(step, flush=True)
        time.sleep(0.005)
""")


def test_store_survives_sigkill_and_show_reads_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    code = CHILD.format(run_dir=str(run_dir), tests=str(Path(__file__).parents[1]))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env=child_env())
    assert child.stdout is not None
    last = -1
    deadline = time.monotonic() + 120
    while last < 60 and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        last = int(line)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert last >= 60, "the child must have trained for a while"

    reader = RunReader(run_dir)
    steps = [row["step"] for row in reader.steps()]
    assert steps == list(range(len(steps))), "no gaps"
    assert len(steps) >= last, f"at most the last step may be missing ({len(steps)} vs {last + 1})"
    assert reader.meta()["status"] == "running"  # it never closed
    assert reader.summary()["process"] == "gone"
    result = cli("show", str(run_dir))
    assert result.returncode == 0, result.stderr
    assert "status     running (policy protect" in result.stdout
    assert f"its process {child.pid} is gone" in result.stdout
    assert f"steps      {len(steps)} recorded" in result.stdout
    # the directory is free again: the OS released the killed writer's lock
    RunStore(run_dir).close()


def test_a_full_disk_is_reported_and_training_goes_on(tmp_path: Path, caplog) -> None:
    store = RunStore(tmp_path / "run")
    store.put_meta("param_names", ["a", "b", "c"])
    store.flush()
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count={pages + 2}")  # SQLITE_FULL soon: "disk full"
    with caplog.at_level(logging.ERROR, logger="trainguard"):
        for step in range(300):
            store.put_step(step, {"loss": 1.0, "action": "applied", "pad": "x" * 2000},
                           np.arange(3.0))
            if step % 20 == 0:
                store.flush()
        store.flush()
        store.close()
    assert store.failed is not None and "full" in store.failed
    assert store.dropped > 0
    assert sum("stopped writing" in r.message for r in caplog.records) == 1, "reported once"
