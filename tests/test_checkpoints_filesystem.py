"""`list_checkpoints`, `last_healthy_checkpoint` and `trainguard checkpoints` on a hostile or
merely unlucky file system: links that dangle or loop, folders nobody may read, checkpoints
rotated away mid-scan, sidecars that are FIFOs or devices or hold non-finite numbers, and
directory symlink loops. Nothing raises; the API answers None or leaves the entry out, the
command answers or exits 2 with one line."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from torch import nn

import trainguard
from trainguard import GuardConfig
from trainguard.checkpoints import SIDECAR, list_checkpoints, sidecar_path

from .test_cli import assert_one_error, call


@pytest.fixture
def guard() -> Iterator[trainguard.Guard]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    made = trainguard.Guard(model, torch.optim.SGD(model.parameters(), lr=0.1),
                            config=GuardConfig(sinks={"console": False}))
    yield made
    made.close()


def _checkpoint(folder: Path, guard: trainguard.Guard, step: int) -> Path:
    """An HF-style checkpoint folder with a weight file, marked at `step`."""
    folder.mkdir(parents=True)
    torch.save(guard.run.model.state_dict(), folder / "model.pt")
    assert trainguard.mark_checkpoint(folder, guard, step=step) is not None
    return folder


def _statuses(out: Path) -> dict[str, str]:
    return {e.path.relative_to(out).as_posix(): e.status
            for e in list_checkpoints(out, strict=False)}


def test_links_inside_a_checkpoint_never_raise(tmp_path: Path, guard: trainguard.Guard,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A dangling link and a link to itself, there when marked or added later."""
    first = tmp_path / "checkpoint-10"
    first.mkdir()
    (first / "dangling").symlink_to(tmp_path / "nowhere")
    (first / "loop").symlink_to(first / "loop")
    torch.save(guard.run.model.state_dict(), first / "model.pt")
    assert trainguard.mark_checkpoint(first, guard, step=10) is not None
    later = _checkpoint(tmp_path / "checkpoint-20", guard, 20)
    (later / "dangling").symlink_to(tmp_path / "nowhere")
    (later / "loop").symlink_to(later / "loop")
    assert _statuses(tmp_path) == {"checkpoint-10": "healthy", "checkpoint-20": "changed"}
    assert trainguard.last_healthy_checkpoint(tmp_path) == first
    code, out, err = call("checkpoints", str(tmp_path), capsys=capsys)
    assert code == 0 and out.splitlines()[-1] == f"last healthy: {first}", err


@contextmanager
def _another_user() -> Iterator[None]:
    """Run a block as a user the folders' permissions apply to (root reads everything)."""
    if os.geteuid() != 0:
        yield
        return
    os.setegid(65534)
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def test_folders_that_cannot_be_read_never_raise(guard: trainguard.Guard,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = Path(tempfile.mkdtemp(prefix="trainguard-perm-"))  # other users can reach it
    try:
        out.chmod(0o755)
        good = _checkpoint(out / "checkpoint-10", guard, 10)
        _checkpoint(out / "locked" / "checkpoint-20", guard, 20)
        (out / "locked").chmod(0)
        with _another_user():
            entries = list_checkpoints(out, strict=False)
            best = trainguard.last_healthy_checkpoint(out)
            listed = call("checkpoints", str(out), capsys=capsys)
        assert [e.path for e in entries] == [good] and best == good
        assert listed[0] == 0, listed[2]
        out.chmod(0)
        with _another_user():
            best = trainguard.last_healthy_checkpoint(out)
            code, printed, err = call("checkpoints", str(out), capsys=capsys)
        assert best is None
        assert_one_error(code, printed, err, "cannot read")
    finally:
        out.chmod(0o755)
        (out / "locked").chmod(0o755)
        shutil.rmtree(out)


def test_a_checkpoint_rotated_away_during_the_scan_is_left_out(
        tmp_path: Path, guard: trainguard.Guard, capsys: pytest.CaptureFixture[str]) -> None:
    """A trainer saves a checkpoint and removes the one before the last, 100 times a second,
    while the folder is listed."""
    out, staging = tmp_path / "out", tmp_path / "staging"
    out.mkdir()
    template = _checkpoint(staging / "template", guard, 10)
    done = threading.Event()

    def rotate() -> None:
        step = 0
        while not done.is_set():
            step += 1
            new = staging / f"checkpoint-{step}"
            shutil.copytree(template, new, copy_function=shutil.copyfile)
            new.rename(out / new.name)  # saved whole, as a trainer's rename does
            shutil.rmtree(out / f"checkpoint-{step - 2}", ignore_errors=True)
            time.sleep(0.01)

    rotator = threading.Thread(target=rotate, daemon=True)
    rotator.start()
    while not list(out.iterdir()):  # from the first save on, a checkpoint is always there
        time.sleep(0.01)
    failures: list[str] = []
    deadline = time.monotonic() + 2.0
    calls = 0
    try:
        while time.monotonic() < deadline:
            calls += 1
            try:
                list_checkpoints(out, strict=False)
                trainguard.last_healthy_checkpoint(out)
                code, _, err = call("checkpoints", str(out), capsys=capsys)
                if code != 0:
                    failures.append(err)
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
    finally:
        done.set()
        rotator.join(timeout=30)
    assert calls > 5 and not failures, (calls, failures[:3])


@pytest.mark.parametrize("field, raw, listed", [
    ("saved_at", '"nan"', False), ("saved_at", "1e400", False),
    ("open_events", '[{"kind": "loss_spike", "step": 1e400, "severity": "error"}]', True)])
def test_non_finite_numbers_in_a_sidecar_never_crash_json(
        tmp_path: Path, guard: trainguard.Guard, capsys: pytest.CaptureFixture[str],
        field: str, raw: str, listed: bool) -> None:
    good = _checkpoint(tmp_path / "checkpoint-10", guard, 10)
    bad = _checkpoint(tmp_path / "checkpoint-20", guard, 20)
    data = json.loads(sidecar_path(bad).read_text())
    data[field] = "@@"
    sidecar_path(bad).write_text(json.dumps(data).replace('"@@"', raw))
    code, out, err = call("checkpoints", str(tmp_path), "--json", capsys=capsys)
    if listed:  # the event that is not one is left out; the rest is shown
        assert code == 0, err
        shown = json.loads(out)
        assert shown["checkpoints"][1]["sidecar"]["open_events"] == []
        assert shown["last_healthy"] == str(bad)
    else:
        assert_one_error(code, out, err, str(sidecar_path(bad)))
        assert trainguard.last_healthy_checkpoint(tmp_path) == good


_READ_IN_A_BOX = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))   # a runaway read fails, fast
import trainguard
from trainguard.cli import main
print("last healthy:", trainguard.last_healthy_checkpoint(sys.argv[1]), flush=True)
sys.exit(main(["checkpoints", sys.argv[1]]))
"""


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_AS"), reason="needs RLIMIT_AS")
def test_a_sidecar_that_is_a_fifo_or_a_device_is_refused(tmp_path: Path,
                                                         guard: trainguard.Guard) -> None:
    """Read only as a regular file, within its byte bound: no hang, no endless read."""
    good = _checkpoint(tmp_path / "checkpoint-10", guard, 10)
    fifo = _checkpoint(tmp_path / "checkpoint-20", guard, 20)
    sidecar_path(fifo).unlink()
    os.mkfifo(sidecar_path(fifo))
    (tmp_path / "loose.pt").write_bytes(b"weights")
    (tmp_path / f"loose.pt.{SIDECAR}").symlink_to("/dev/zero")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_READ_IN_A_BOX), str(tmp_path)],
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                          capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 30
    assert done.stdout.splitlines() == [f"last healthy: {good}"], done.stderr[-2000:]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "not a regular file" in done.stderr, done.stderr


def test_directory_symlink_loops_are_not_followed(tmp_path: Path,
                                                  guard: trainguard.Guard) -> None:
    """Each checkpoint is listed once, by its own path, whatever links lead to it."""
    old = _checkpoint(tmp_path / "checkpoint-10", guard, 10)
    new = _checkpoint(tmp_path / "checkpoint-30", guard, 30)
    for index in range(20):
        (tmp_path / f"loop{index}").symlink_to(tmp_path)
    (tmp_path / "a-latest").symlink_to(new)  # sorts before the checkpoint it points to
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "up").symlink_to("..")
    started = time.monotonic()
    entries = list_checkpoints(tmp_path)
    assert [e.path for e in entries] == [old, new]
    assert trainguard.last_healthy_checkpoint(tmp_path) == new
    assert time.monotonic() - started < 5
