"""A snapshot's zip archive is checked before torch.load: a decompression bomb (a few KB that
inflate to many MB, here scaled down with `max_inflated`) and entries whose declared sizes lie are
one SnapshotError, and torch.load never sees them."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import trainguard
from trainguard import snapshot
from trainguard.cli import main
from trainguard.errors import SnapshotError
from trainguard.snapshot import build_snapshot, write_snapshot

MiB = 1 << 20
FACTORY = str(Path(__file__).parent / "factory_for_cli.py")


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path_factory.mktemp("snap") / "good.pt"
    return write_snapshot(path, build_snapshot(step=3, model=model, optimizers=[optimizer],
                                               batch=torch.randn(2, 4)))


def _rewrite(good: Path, out: Path, entry: str, size: int, *,
             method: int = zipfile.ZIP_DEFLATED,
             declare: Callable[[zipfile.ZipInfo], None] | None = None) -> Path:
    """A copy of `good` whose `entry` holds `size` zero bytes with `method`, written in 1 MiB
    pieces (the test's memory stays small); `declare` then changes what the directory says."""
    source = zipfile.ZipFile(good)
    with zipfile.ZipFile(out, "w") as archive:
        for info in source.infolist():
            if info.filename != entry:
                archive.writestr(info.filename, source.read(info))
                continue
            replaced = zipfile.ZipInfo(entry)
            replaced.compress_type = method
            with archive.open(replaced, "w", force_zip64=True) as handle:
                piece = bytes(MiB)
                for start in range(0, size, MiB):
                    handle.write(piece[: min(MiB, size - start)])
            if declare is not None:
                declare(archive.filelist[-1])  # the central directory is written at close
    return out


def _entry(good: Path) -> str:
    return next(n for n in zipfile.ZipFile(good).namelist() if n.endswith("/data/0"))


def _no_torch_load(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.load was reached")

    monkeypatch.setattr(torch, "load", refuse)


def test_a_real_snapshot_inflates_nothing(good: Path) -> None:
    """torch.save stores its entries: a real snapshot loads even with no inflation allowed."""
    assert all(i.compress_type == zipfile.ZIP_STORED for i in zipfile.ZipFile(good).infolist())
    assert trainguard.load_snapshot(good, max_inflated=0)["step"] == 3


def test_a_deflate_bomb_is_refused_before_torch_load(good: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = _rewrite(good, tmp_path / "bomb.pt", _entry(good), 64 * MiB)
    assert bomb.stat().st_size < 200_000
    _no_torch_load(monkeypatch)
    with pytest.raises(SnapshotError, match=r"would inflate to 64\.0 MiB from \d+\.\d KiB, more "
                                            r"than the 16\.0 MiB beyond their size in the file "
                                            r"that trainguard allows"):
        trainguard.load_snapshot(bomb, max_inflated=16 * MiB)


def test_replay_refuses_a_bomb_in_one_line(good: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    bomb = _rewrite(good, tmp_path / "bomb.pt", _entry(good), 64 * MiB)
    monkeypatch.setattr(snapshot, "MAX_INFLATED", 16 * MiB)  # the default, scaled down
    _no_torch_load(monkeypatch)
    code = main(["replay", str(bomb), "--factory", f"{FACTORY}:model_and_loss"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.startswith("trainguard: error: ") and captured.err.count("\n") == 1
    assert "16.0 MiB beyond their size in the file" in captured.err
    assert "max_inflated" in captured.err


def test_a_compressed_snapshot_within_the_limit_loads(good: Path, tmp_path: Path) -> None:
    """Deflating is no fault in itself: a snapshot whose entries are deflated loads."""
    packed = tmp_path / "packed.pt"
    source = zipfile.ZipFile(good)
    with zipfile.ZipFile(packed, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for info in source.infolist():
            archive.writestr(info.filename, source.read(info))
    assert trainguard.load_snapshot(packed)["step"] == 3


def _say(size: int) -> Callable[[zipfile.ZipInfo], None]:
    def declare(info: zipfile.ZipInfo) -> None:
        info.file_size = size

    return declare


def _shorten(info: zipfile.ZipInfo) -> None:
    info.compress_size //= 2


@pytest.mark.parametrize("case, method, declare, message", [
    ("declares less", zipfile.ZIP_DEFLATED, _say(1000),
     "declares 1,000 bytes but holds more than 1,000 bytes when inflated"),
    ("declares more", zipfile.ZIP_DEFLATED, _say(2 * MiB),
     "declares 2,097,152 bytes but holds 1,048,576 bytes when inflated"),
    ("stored lies", zipfile.ZIP_STORED, _say(4 * MiB),
     "declares 4,194,304 bytes but holds 1,048,576 stored bytes"),
    ("cut short", zipfile.ZIP_DEFLATED, _shorten, "is not a whole deflate stream"),
    ("bzip2", zipfile.ZIP_BZIP2, None, "uses compression method 12, which torch cannot read"),
])
def test_entries_that_lie_about_their_size_are_refused(
        good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, method: int,
        declare: Callable[[zipfile.ZipInfo], None] | None, message: str) -> None:
    path = _rewrite(good, tmp_path / "lying.pt", _entry(good), MiB, method=method,
                    declare=declare)
    _no_torch_load(monkeypatch)
    with pytest.raises(SnapshotError, match="not a readable trainguard snapshot") as info:
        trainguard.load_snapshot(path)
    assert message in str(info.value) and "\n" not in str(info.value)
