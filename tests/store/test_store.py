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

import trainguard
from trainguard import GuardConfig, RunReader, StoreError
from trainguard.events import Event
from trainguard.store import DB_NAME, RunStore

from ..conftest import make_setup
from ..test_guard import train

SRC = Path(trainguard.__file__).resolve().parents[1]


def test_round_trip_keeps_nan_and_inf(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.put_meta("param_names", ["a", "b", "c"])
    store.put_step(0, {"loss": 1.5, "grad_norm": 0.3, "action": "applied"},
                   np.array([0.1, 0.2, 0.3]))
    store.put_step(1, {"loss": math.nan, "grad_norm": math.inf, "action": "skipped"},
                   np.array([math.nan, math.inf, -math.inf]))
    store.put_param_metrics(1, {"weight_maxabs": np.array([1.0, math.nan, 3.0])})
    store.put_module_metrics(1, ["m1", "m2"], {"act_maxabs": np.array([math.inf, 2.0])})
    store.put_event(Event("nonfinite_loss", 1, "error", "loss is nan", value=math.nan))
    store.close()

    reader = RunReader(tmp_path)
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
    summary = reader.summary()
    assert summary["loss"]["nan"] == 1 and summary["grad_norm_nonfinite_steps"] == 1
    assert summary["worst_params"][0]["nonfinite_steps"] == 1


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
    import sys, time, torch
    sys.path.insert(0, {src!r})
    import trainguard
    from trainguard.demo import MarkovLanguage, TinyCausalLM
    torch.manual_seed(0)
    language = MarkovLanguage(vocab_size=32)
    model = TinyCausalLM(vocab_size=32, d_model=32, n_layer=1, n_head=2, max_len=32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    guard = trainguard.Guard(model, optimizer, run_dir={run_dir!r},
                             config=trainguard.GuardConfig(console=False, sample_every=10))
    for step in range(100000):
        loss = model.loss(language.batch(8, 17))
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
        print(step, flush=True)
        time.sleep(0.005)
""")


def test_store_survives_sigkill_and_show_reads_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(src=str(SRC),
                                                                  run_dir=str(run_dir))],
                             stdout=subprocess.PIPE, text=True)
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
    result = subprocess.run([sys.executable, "-m", "trainguard", "show", str(run_dir)],
                            capture_output=True, text=True, env={**os.environ,
                                                                 "PYTHONPATH": str(SRC)})
    assert result.returncode == 0, result.stderr
    assert "status     running" in result.stdout
    assert f"steps      {len(steps)} recorded" in result.stdout


def test_a_full_disk_is_reported_and_training_goes_on(tmp_path: Path, caplog) -> None:
    setup = make_setup()
    guard = trainguard.Guard(setup.model, setup.optimizer, run_dir=tmp_path / "run",
                             config=GuardConfig(console=False))
    store = guard.engine.store
    assert store is not None
    store.flush()
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count={pages + 2}")  # SQLITE_FULL soon: "disk full"
    with caplog.at_level(logging.ERROR, logger="trainguard"):
        reports = train(guard, setup, 60)
        store.flush()
        guard.close()
    assert len(reports) == 60
    assert store.failed is not None and "full" in store.failed
    assert store.dropped > 0
    assert any("stopped writing" in r.message for r in caplog.records)
