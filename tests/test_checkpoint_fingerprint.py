"""A checkpoint's fingerprint: kept by a copy, lost by an in-place change anywhere a MiB long,
blind to nothing that hangs, and sidecars of the earlier size-and-time kind still judged."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import torch
from torch import nn

import trainguard
from trainguard import GuardConfig
from trainguard.checkpoint_fingerprint import STRIDE, differs, take
from trainguard.checkpoints import read_health, sidecar_path


def _none(name: str) -> bool:
    return False


def test_a_copy_matches_and_a_mib_changed_anywhere_does_not(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint-10"
    folder.mkdir()
    data = os.urandom(40 << 20)  # sampled, not read whole
    (folder / "model.safetensors").write_bytes(data)
    (folder / "config.json").write_text("{}")
    marked = take(folder, _none)
    assert differs(folder, marked, _none) is None
    shutil.copytree(folder, tmp_path / "copy", copy_function=shutil.copyfile)
    assert differs(tmp_path / "copy", marked, _none) is None
    for offset in (0, 7 << 20, (40 << 20) - STRIDE - 1):  # head, middle, near the tail
        changed = tmp_path / f"changed-{offset}"
        shutil.copytree(folder, changed)
        with open(changed / "model.safetensors", "r+b") as handle:
            handle.seek(offset)
            handle.write(b"\xff" * STRIDE)
        assert "content changed" in (differs(changed, marked, _none) or ""), offset


def test_a_fifo_or_a_device_in_a_checkpoint_is_never_read(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint-10"
    folder.mkdir()
    os.mkfifo(folder / "pipe")
    (folder / "zero").symlink_to("/dev/zero")
    (folder / "model.bin").write_bytes(b"weights")
    result: list[object] = []
    worker = threading.Thread(target=lambda: result.append(take(folder, _none)), daemon=True)
    worker.start()
    worker.join(timeout=10)
    if worker.is_alive():  # a blocked open: let it through so the thread ends
        os.close(os.open(folder / "pipe", os.O_WRONLY | os.O_NONBLOCK))
    assert result, "the fingerprint did not hang"
    assert differs(folder, result[0], _none) is None  # type: ignore[arg-type]


def test_a_sidecar_of_the_earlier_kind_is_judged_by_size_and_time(tmp_path: Path) -> None:
    """Earlier sidecars held each file's [size, mtime_ns]: they read as they were judged."""
    model = nn.Linear(4, 1)
    guard = trainguard.Guard(model, torch.optim.SGD(model.parameters(), lr=0.1),
                             config=GuardConfig(sinks={"console": False}))
    path = tmp_path / "step10.pt"
    torch.save(model.state_dict(), path)
    assert trainguard.mark_checkpoint(path, guard) is not None
    guard.close()
    data = json.loads(sidecar_path(path).read_text())
    info = path.stat()
    data.pop("content")
    data["fingerprint"] = {path.name: [info.st_size, info.st_mtime_ns]}
    sidecar_path(path).write_text(json.dumps(data))
    assert read_health(path).status == "healthy"
    assert trainguard.last_healthy_checkpoint(tmp_path) == path
    os.utime(path, ns=(0, 0))
    assert read_health(path).status == "stale"
