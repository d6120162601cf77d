"""A process killed while writing a crash snapshot leaves a hidden temporary file as large as the
snapshot; the next Guard in that directory, and the next snapshot written there, remove it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from trainguard import Guard, GuardConfig
from trainguard import snapshot as snapshots
from trainguard.snapshot import clean_stale_temps, write_snapshot

from .store.helpers import child_env


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _temp(directory: Path, name: str, age_s: float = 0.0) -> Path:
    path = directory / name
    path.write_bytes(b"x" * 1000)
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


def test_only_the_temporaries_of_gone_writers_are_removed(tmp_path: Path) -> None:
    host = snapshots._host()
    old = snapshots.STALE_AFTER_S + 60
    dead = _temp(tmp_path, f".crash_step3.pt.{_dead_pid()}.{host}.abc123_x.tmp")
    alive = _temp(tmp_path, f".crash_step4.pt.{os.getppid()}.{host}.abc123.tmp")
    mine = _temp(tmp_path, f".crash_step5.pt.{os.getpid()}.{host}.abc123.tmp")
    elsewhere = _temp(tmp_path, ".crash_step6.pt.123.otherhost.abc123.tmp")
    elsewhere_old = _temp(tmp_path, ".crash_step7.pt.123.otherhost.abc123.tmp", age_s=old)
    legacy = _temp(tmp_path, ".crash_step8.pt.k2j4h5g1.tmp")
    legacy_old = _temp(tmp_path, ".crash_step9_rank1.pt.k2j4h5g1.tmp", age_s=old)
    unrelated = _temp(tmp_path, ".notes.tmp", age_s=old)
    snapshot = _temp(tmp_path, "crash_step2.pt", age_s=old)

    removed = clean_stale_temps(tmp_path)
    assert sorted(removed) == sorted([dead, elsewhere_old, legacy_old])
    for kept in (alive, mine, elsewhere, legacy, unrelated, snapshot):
        assert kept.exists()
    assert clean_stale_temps(tmp_path / "missing") == []


def test_a_failed_write_leaves_no_temporary(tmp_path: Path, monkeypatch) -> None:
    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", no_space)
    with pytest.raises(OSError):
        write_snapshot(tmp_path / "crash_step1.pt", {"step": 1})
    assert list(tmp_path.iterdir()) == []


def test_a_kill_during_a_snapshot_write_is_cleaned_up_by_the_next_guard(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import sys, torch
        from trainguard.snapshot import write_snapshot
        big = {"weights": torch.zeros(16_000_000)}   # 64 MB: the write takes a while
        step = 0
        while True:
            write_snapshot(sys.argv[1] + f"/crash_step{step}.pt", big)
            step += 1
    """)
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=child_env())
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".crash_step*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.005)
    child.send_signal(signal.SIGKILL)
    child.wait()
    leftovers = list(tmp_path.glob(".crash_step*.tmp"))
    assert leftovers, "killed in the middle of a write"

    model = torch.nn.Linear(2, 1)
    guard = Guard(model, torch.optim.SGD(model.parameters(), lr=0.1),
                  config=GuardConfig(sinks={"console": False}), run_dir=tmp_path)
    guard.close()
    assert not any(path.exists() for path in leftovers)
    assert not list(tmp_path.glob(".*.tmp"))
