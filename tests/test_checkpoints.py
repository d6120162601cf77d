"""Checkpoint sidecars in a plain loop that saves with `torch.save`: the healthy checkpoint before
a NaN survives marked healthy, the NaN ones are marked poisoned (renamed when blocked), a resume
from `last_healthy_checkpoint` with the bad data still there ends where the healthy run ends, the
Guard's skip list comes back with the checkpoint, and sidecars are written atomically."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import trainguard
from trainguard import GuardConfig
from trainguard.checkpoint_health import load_guard_state
from trainguard.checkpoints import (
    CheckpointError,
    list_checkpoints,
    read_health,
    sidecar_path,
    state_path,
)
from trainguard.finiteness import finite_state
from trainguard.recovery import SkippingSampler

STEPS, SAVE_EVERY, BAD = 60, 10, range(35, 38)
"""60 steps, a checkpoint every 10; the batches of steps 35 to 37 hold an inf."""


def _data(bad: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(8, 1, generator=gen)
    batches = []
    for step in range(STEPS):
        x = torch.randn(16, 8, generator=gen)
        y = x @ w + 0.05 * torch.randn(16, 1, generator=gen)
        if bad and step in BAD:
            x = x.clone()
            x[0, 0] = float("inf")  # a corrupt record: the loss and every gradient go NaN
        batches.append((x, y))
    return batches


def _eval_loss(model: nn.Module) -> float:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=gen)
    w = torch.randn(8, 1, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(x), x @ w))


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train(out: Path | None, policy: str, *, bad: bool = True, start: Path | None = None,
           **config: Any) -> tuple[nn.Module, trainguard.Guard]:
    """The loop a user writes: forward, backward, guard.step, torch.save + mark_checkpoint."""
    model, optimizer = _model()
    guard = trainguard.Guard(model, optimizer, config=GuardConfig(
        policy=policy, sinks={"console": False}, **config))  # type: ignore[arg-type]
    first = 0
    if start is not None:
        saved = torch.load(start, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        assert trainguard.resume_guard(start, guard)
        first = saved["step"]
    for step, (x, y) in enumerate(_data(bad)[first:], start=first):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
        if out is not None and (step + 1) % SAVE_EVERY == 0:
            path = out / f"step{step + 1}.pt"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step + 1}, path)
            trainguard.mark_checkpoint(path, guard)
    guard.close()
    return model, guard


def _statuses(out: Path) -> dict[str, str]:
    return {e.path.name: e.status for e in list_checkpoints(out)}


def test_observe_marks_the_nan_checkpoints_poisoned_and_keeps_the_healthy_one(
        tmp_path: Path) -> None:
    model, guard = _train(tmp_path, "observe")
    assert not all(torch.isfinite(p).all() for p in model.parameters())  # observe changed nothing
    assert _statuses(tmp_path) == {"step10.pt": "healthy", "step20.pt": "healthy",
                                   "step30.pt": "healthy", "step40.pt": "poisoned",
                                   "step50.pt": "poisoned", "step60.pt": "poisoned"}
    assert trainguard.last_healthy_checkpoint(tmp_path) == tmp_path / "step30.pt"
    poisoned = [e for e in guard.events if e.kind == "poisoned_checkpoint"]
    assert [e.step for e in poisoned] == [40, 50, 60]
    assert "step40.pt" in poisoned[0].message
    health = read_health(tmp_path / "step40.pt").health
    assert health is not None and not health.weights_finite and health.optimizer_finite is False
    # a few NaN losses do not make the loss verdict degraded yet; NaN weights do
    assert health.verdict == "degraded"


def test_protect_poisons_nothing_and_blocking_renames_the_poisoned(tmp_path: Path) -> None:
    (tmp_path / "protect").mkdir()
    _train(tmp_path / "protect", "protect")
    statuses = _statuses(tmp_path / "protect")
    assert "poisoned" not in statuses.values()
    assert statuses["step40.pt"] == "incident"  # the skipped NaN steps were 3 to 5 steps before
    assert statuses["step60.pt"] == "healthy"

    (tmp_path / "blocked").mkdir()
    _train(tmp_path / "blocked", "observe", checkpoints={"block_poisoned": True})
    names = sorted(p.name for p in (tmp_path / "blocked").iterdir() if p.suffix != ".json")
    assert "step40.pt.poisoned" in names and "step40.pt" not in names
    assert _statuses(tmp_path / "blocked")["step40.pt.poisoned"] == "poisoned"
    assert trainguard.last_healthy_checkpoint(tmp_path / "blocked") == (
        tmp_path / "blocked" / "step30.pt")


def test_a_resume_from_the_last_healthy_checkpoint_ends_as_the_healthy_run(
        tmp_path: Path) -> None:
    healthy, _ = _train(None, "observe", bad=False)
    _train(tmp_path, "observe")
    start = trainguard.last_healthy_checkpoint(tmp_path)
    assert start is not None
    resumed, guard = _train(None, "protect", start=start)  # the bad batches are still there
    assert all(torch.isfinite(p).all() for p in resumed.parameters())
    assert guard.run.state.step == STEPS  # the Guard's step count came back with the state
    # skipped at the bad batches, no relapse after them
    assert sorted({e.step for e in guard.events if e.kind.startswith("nonfinite")}) == list(BAD)
    assert abs(_eval_loss(resumed) / _eval_loss(healthy) - 1) < 0.05


def test_the_skip_list_comes_back_with_the_checkpoint(tmp_path: Path) -> None:
    """Under recover, the skipped steps' samples are blamed; a checkpoint saved later carries the
    skip list: a job resumed from it never sees them again."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(256, 8, generator=gen), torch.randn(8, 1, generator=gen)
    y = x @ w
    x[40:48, 0] = float("inf")  # the bad samples
    model, optimizer = _model()
    config = GuardConfig(policy="recover", sinks={"console": False})
    guard = trainguard.Guard(model, optimizer, config=config)
    sampler = SkippingSampler(range(256), guard)
    for _ in range(3):
        order = list(sampler)
        for start in range(0, len(order), 8):
            ids = order[start:start + 8]
            loss = nn.functional.mse_loss(model(x[ids]), y[ids])
            loss.backward()
            guard.step(loss, data_ids=ids)
            optimizer.zero_grad(set_to_none=True)
    assert set(range(40, 48)) <= guard.skipped_data
    path = tmp_path / "after.pt"
    torch.save({"model": model.state_dict()}, path)
    assert trainguard.mark_checkpoint(path, guard) is not None
    guard.close()
    assert _statuses(tmp_path)["after.pt"] == "healthy"
    assert trainguard.last_healthy_checkpoint(tmp_path) == path

    fresh_model, fresh_opt = _model()
    fresh_model.load_state_dict(torch.load(path, weights_only=True)["model"])
    resumed = trainguard.Guard(fresh_model, fresh_opt, config=config)
    assert trainguard.resume_guard(path, resumed)
    assert set(range(40, 48)) <= resumed.skipped_data
    assert not set(SkippingSampler(range(256), resumed)) & set(range(40, 48))
    resumed.close()


def test_the_finiteness_check_sees_one_nan_anywhere() -> None:
    model, optimizer = _model()
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    assert finite_state(model.parameters(), optimizer) == (True, True)
    state = optimizer.state[next(iter(optimizer.state))]
    state["exp_avg_sq"].view(-1)[0] = float("nan")
    assert finite_state(model.parameters(), optimizer) == (True, False)
    with torch.no_grad():
        model[0].weight.fill_(3e38)  # finite, though its 2-norm overflows
    assert finite_state(model.parameters(), None) == (True, None)
    with torch.no_grad():
        model[2].bias.fill_(float("-inf"))
    assert finite_state(model.parameters(), None) == (False, None)
    half = nn.Linear(300, 300).half()
    with torch.no_grad():
        half.weight.fill_(60000.0)  # its float16 2-norm would be inf: accumulated in float32
    assert finite_state(half.parameters(), None) == (True, None)


def test_an_old_sidecar_never_describes_a_new_checkpoint(tmp_path: Path) -> None:
    model, optimizer = _model()
    guard = trainguard.Guard(model, optimizer, config=GuardConfig(sinks={"console": False}))
    path = tmp_path / "latest.pt"
    torch.save(model.state_dict(), path)
    assert trainguard.mark_checkpoint(path, guard) is not None
    assert read_health(path).status == "healthy"
    os.utime(path, ns=(0, 0))  # touched: its time differs, its bytes do not
    assert read_health(path).status == "healthy"
    size = path.stat().st_size
    with torch.no_grad():
        for param in model.parameters():
            param.add_(1.0)
    torch.save(model.state_dict(), path)  # written again: the same size, other weights
    assert path.stat().st_size == size
    entry = read_health(path)
    assert entry.status == "changed" and trainguard.last_healthy_checkpoint(tmp_path) is None
    guard.close()


def test_a_copied_folder_still_finds_its_last_healthy_checkpoint(tmp_path: Path) -> None:
    """A copy that keeps no times (`cp -r`, sync tools, object stores) keeps every status."""
    (tmp_path / "run").mkdir()
    _train(tmp_path / "run", "observe")
    shutil.copytree(tmp_path / "run", tmp_path / "copy", copy_function=shutil.copyfile)
    assert (tmp_path / "copy" / "step30.pt").stat().st_mtime_ns != (
        tmp_path / "run" / "step30.pt").stat().st_mtime_ns
    assert _statuses(tmp_path / "copy") == _statuses(tmp_path / "run")
    assert trainguard.last_healthy_checkpoint(tmp_path / "copy") == tmp_path / "copy" / "step30.pt"


def _overwrite_keeping_times(path: Path, offset: int, data: bytes) -> None:
    """Write `data` into `path` at `offset` in place, then set its times back."""
    before = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns


def test_weights_overwritten_with_nan_in_place_are_not_healthy(tmp_path: Path) -> None:
    """The same file, the same size and modification time, NaN weights: `changed`."""
    model, optimizer = _model()
    guard = trainguard.Guard(model, optimizer, config=GuardConfig(sinks={"console": False}))
    path = tmp_path / "step10.pt"
    torch.save(model.state_dict(), path)
    folder = tmp_path / "checkpoint-20"  # an HF folder: a raw float32 weight file
    folder.mkdir()
    (folder / "model.bin").write_bytes(torch.randn(3 << 20).numpy().tobytes())  # 12 MiB
    for checkpoint in (path, folder):
        assert trainguard.mark_checkpoint(checkpoint, guard) is not None
    guard.close()
    assert _statuses(tmp_path) == {"step10.pt": "healthy", "checkpoint-20": "healthy"}

    nan = torch.full((1 << 20,), float("nan")).numpy().tobytes()  # 4 MiB of NaN
    _overwrite_keeping_times(folder / "model.bin", 6 << 20, nan)
    weights = dict(torch.load(path, weights_only=True))
    raw = path.read_bytes()
    first = weights["0.weight"].numpy().tobytes()
    assert raw.count(first) == 1
    _overwrite_keeping_times(path, raw.index(first), bytes(nan[:len(first)]))
    assert torch.load(path, weights_only=True)["0.weight"].isnan().all()  # the NaN is read back
    assert _statuses(tmp_path) == {"step10.pt": "changed", "checkpoint-20": "changed"}
    assert "content changed" in (read_health(path).problem or "")
    assert trainguard.last_healthy_checkpoint(tmp_path) is None


def test_sidecars_and_state_files_take_the_umask_permissions(tmp_path: Path) -> None:
    """Another user of a shared output folder reads what trainguard wrote there."""
    model, optimizer = _model()
    guard = trainguard.Guard(model, optimizer, config=GuardConfig(sinks={"console": False}))
    path = tmp_path / "step10.pt"
    torch.save(model.state_dict(), path)
    old = os.umask(0o022)
    try:
        assert trainguard.mark_checkpoint(path, guard) is not None
    finally:
        os.umask(old)
    guard.close()
    for own in (sidecar_path(path), state_path(path)):
        assert stat.S_IMODE(own.stat().st_mode) == 0o644, own.name


@pytest.mark.slow
def test_a_folder_of_12000_files_gets_a_sidecar_its_reader_accepts(tmp_path: Path) -> None:
    """The sidecar's size does not grow with the checkpoint's files."""
    model, optimizer = _model()
    guard = trainguard.Guard(model, optimizer, config=GuardConfig(sinks={"console": False}))
    sizes = []
    for count in (1, 12_000):
        folder = tmp_path / f"checkpoint-{count}"
        (folder / "shards").mkdir(parents=True)
        for index in range(count):
            (folder / "shards" / f"part-{index:05d}.bin").write_bytes(index.to_bytes(4, "little"))
        assert trainguard.mark_checkpoint(folder, guard, step=count) is not None
        sizes.append(sidecar_path(folder).stat().st_size)
    guard.close()
    assert sizes[1] - sizes[0] < 16 and sizes[1] < 4096, sizes
    assert trainguard.last_healthy_checkpoint(tmp_path) == tmp_path / "checkpoint-12000"


_KILLED_WRITE = """
import os, signal, sys, torch
from torch import nn
import trainguard
from trainguard import checkpoints

path = sys.argv[1]
model = nn.Linear(4, 1)
guard = trainguard.Guard(model, torch.optim.SGD(model.parameters(), lr=0.1),
                         config=trainguard.GuardConfig(console=False))
torch.save(model.state_dict(), path)                 # the checkpoint is written again
real = os.fdopen
def dying_fdopen(fd, *args, **kwargs):               # ... and the process is killed half-way
    handle = real(fd, *args, **kwargs)               # through writing its new sidecar
    def write(text):
        handle.buffer.write(text[: len(text) // 2].encode()); handle.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    handle.write = write
    return handle
checkpoints.os.fdopen = dying_fdopen
trainguard.mark_checkpoint(path, guard)
"""


def test_a_kill_during_the_sidecar_write_leaves_no_half_sidecar(tmp_path: Path) -> None:
    model, optimizer = _model()
    guard = trainguard.Guard(model, optimizer, config=GuardConfig(sinks={"console": False}))
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    trainguard.mark_checkpoint(path, guard)
    guard.close()
    assert read_health(path).status == "healthy"
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(_KILLED_WRITE), str(path)],
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                           capture_output=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # killed mid-write
    # the old sidecar is gone (it described the old checkpoint), no half one took its place
    assert not sidecar_path(path).exists()
    with pytest.raises(CheckpointError, match="no trainguard sidecar"):
        read_health(path)
    assert load_guard_state(path) is not None  # the state file was written whole before
    # the next mark cleans the dead write's temporary file and describes the new checkpoint
    model, optimizer = _model()
    guard = trainguard.Guard(model, optimizer, config=GuardConfig(sinks={"console": False}))
    assert trainguard.mark_checkpoint(path, guard) is not None
    guard.close()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert json.loads(sidecar_path(path).read_text())["status"] == "healthy"


def test_a_failing_sidecar_write_is_logged_and_training_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, optimizer = _model()
    guard = trainguard.Guard(model, optimizer, config=GuardConfig(sinks={"console": False}))
    assert trainguard.mark_checkpoint(tmp_path / "never_saved.pt", guard) is None
    assert "could not write the health of checkpoint" in caplog.text
    guard.step(nn.functional.mse_loss(model(torch.randn(2, 8)), torch.zeros(2, 1)))
    guard.close()


def test_guard_checkpoint_health_reports_and_marks(tmp_path: Path) -> None:
    model, optimizer = _model()
    guard = trainguard.Guard(model, optimizer, config=GuardConfig(sinks={"console": False}))
    for x, y in _data(bad=False)[:3]:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    now = guard.checkpoint_health()
    assert now is not None and (now.step, now.status) == (3, "healthy")
    assert now.optimizer_finite is True and list(tmp_path.iterdir()) == []
    torch.save(model.state_dict(), tmp_path / "m.pt")
    marked = guard.checkpoint_health(tmp_path / "m.pt")
    assert marked is not None and read_health(tmp_path / "m.pt").status == "healthy"
    state = load_guard_state(tmp_path / "m.pt")
    assert state is not None and state["step"] == 3
    guard.close()


def test_blocking_is_the_default_under_recover_only() -> None:
    assert GuardConfig(policy="recover").blocks_poisoned_checkpoints
    assert not GuardConfig(policy="protect").blocks_poisoned_checkpoints
    assert not GuardConfig(policy="recover",
                           checkpoints={"block_poisoned": False}).blocks_poisoned_checkpoints
    assert GuardConfig(policy="observe",
                       checkpoints={"block_poisoned": True}).blocks_poisoned_checkpoints
    with pytest.raises(trainguard.ConfigError, match=r"checkpoints\.block_poisoned"):
        GuardConfig(checkpoints={"block_poisoned": "yes"})  # type: ignore[arg-type]
    config = GuardConfig(checkpoints={"block_poisoned": True})
    assert GuardConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
