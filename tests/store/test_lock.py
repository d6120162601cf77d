"""Two live writers on one run directory are refused, never interleaved."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainguard import RunReader
from trainguard.errors import RunDirInUse, TrainguardError, UsageError
from trainguard.store import RunStore

from .helpers import child_env

HOLDER = textwrap.dedent("""
    import sys, time
    from trainguard.store import RunStore
    store = RunStore(sys.argv[1])
    store.put_step(0, {"loss": 1.0, "action": "applied"}, None)
    store.flush()
    print("holding", flush=True)
    time.sleep(600)
""")


def test_a_second_process_is_refused_while_the_first_lives(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)],
                              stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(RunDirInUse) as info:
            RunStore(run_dir)
        message = str(info.value)
        assert str(run_dir) in message and f"process {holder.pid}" in message
        assert "use another run_dir" in message and "stop that process" in message
        assert info.value.pid == holder.pid
        assert isinstance(info.value, UsageError) and isinstance(info.value, TrainguardError)
        with RunReader(run_dir) as reader:  # readers need no lock
            assert len(reader.steps()) == 1 and reader.meta()["status"] == "running"
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    store = RunStore(run_dir)  # the OS released the dead holder's lock
    assert store.run_id == 2
    store.close()


def test_a_second_store_in_the_same_process_is_refused(tmp_path: Path) -> None:
    first = RunStore(tmp_path)
    with pytest.raises(RunDirInUse) as info:
        RunStore(tmp_path)
    message = str(info.value)
    assert str(tmp_path) in message and f"this process (pid {os.getpid()})" in message
    with pytest.raises(RunDirInUse):
        RunStore(tmp_path, resume=True)
    first.put_step(0, {"loss": 1.0, "action": "applied"}, None)
    first.close()
    with RunReader(tmp_path) as reader:
        assert reader.run_ids == [1] and len(reader.steps()) == 1, "the refused ones left no run"
    second = RunStore(tmp_path)
    assert second.run_id == 2
    second.close()


def test_a_guard_no_longer_at_hand_is_closed_by_close_open_runs(tmp_path: Path) -> None:
    """A notebook cell run twice: the first Guard, no longer referenced, still holds the run
    directory (a run is never left open by garbage collection alone); the refusal says how to
    free it, and `trainguard.close_open_runs()` closes that run as interrupted."""
    import gc

    import torch

    import trainguard
    from trainguard import Guard, GuardConfig

    def cell() -> Guard:
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False}),
                      run_dir=tmp_path)
        loss = model(torch.randn(8, 4)).square().mean()
        loss.backward()
        guard.step(loss)
        return guard

    cell()
    gc.collect()
    with pytest.raises(RunDirInUse) as info:
        cell()
    assert "trainguard.close_open_runs()" in str(info.value)
    assert trainguard.close_open_runs() >= 1
    second = cell()
    second.close()
    with RunReader(tmp_path, run=1) as first:
        assert first.meta()["status"] == "interrupted"
    with RunReader(tmp_path, run=2) as latest:
        assert latest.meta()["status"] == "finished"
