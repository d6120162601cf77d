"""The TensorBoard reader's CRC32C check: the known value, a bitwise reference on records of any
mix of lengths (zero, one byte, chunk boundaries, one long record), and event files whose records
all differ in length: read when intact, refused (exit 2) when one byte is changed."""

from __future__ import annotations

import math
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainguard.analyze import read_log, tensorboard, windows
from trainguard.analyze.log import LogBuilder, LogError
from trainguard.analyze.tensorboard import masked_crc32c

from .logs import event_file


def crc32c(data: bytes) -> int:
    """CRC32C (Castagnoli), bit by bit: the definition the vectorised one must agree with."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def crcs(data: bytes, starts: list[int], lengths: list[int]) -> list[int]:
    return masked_crc32c(np.frombuffer(data, dtype=np.uint8), np.asarray(starts, dtype=np.int64),
                         np.asarray(lengths, dtype=np.int64)).tolist()


def test_the_known_crc32c_of_123456789() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    assert crcs(b"123456789", [0], [9]) == [masked(0xE3069283)]


def test_records_of_every_mix_of_lengths_agree_with_the_bitwise_crc() -> None:
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 6000, dtype=np.uint8).tobytes()
    lengths = [0, 1, 7, 8, 31, 32, 33, 64, 65, 2500, *rng.integers(0, 200, 60).tolist()]
    starts = [int(rng.integers(0, len(data) - n + 1)) for n in lengths]
    got = crcs(data, starts, lengths)
    assert got == [masked(crc32c(data[s:s + n])) for s, n in zip(starts, lengths, strict=True)]
    heads = crcs(data, [8 * k for k in range(50)], [8] * 50)  # record lengths: 8 bytes each
    assert heads == [masked(crc32c(data[8 * k:8 * k + 8])) for k in range(50)]


def test_the_crc_agrees_with_tensorboards_own() -> None:
    reference = pytest.importorskip("tensorboard.compat.tensorflow_stub.pywrap_tensorflow")
    data = bytes(range(256)) * 3
    lengths = list(range(0, 700, 7))
    assert crcs(data, [5] * len(lengths), lengths) == [reference.masked_crc32c(data[5:5 + n])
                                                      for n in lengths]


@pytest.fixture
def varied(tmp_path: Path) -> Path:
    """Records of 400 distinct lengths: tags of 1 to 400 characters, one value each."""
    return event_file(tmp_path / "events.out.tfevents.1.host",
                      [(0, "loss", 2.0)] + [(k, "t" * k, float(k)) for k in range(1, 401)])


def test_records_of_distinct_lengths_pass_the_check(varied: Path) -> None:
    log = read_log(varied)
    assert log.format == "tensorboard" and len(log.series) == 401
    assert log.series.points("t" * 250) == ([250], [250.0])


def test_a_changed_byte_in_a_record_of_distinct_lengths_is_refused(varied: Path,
                                                                  tmp_path: Path) -> None:
    data = bytearray(varied.read_bytes())
    at = data.index(b"t" * 300) + 10  # inside a tag: the record still parses
    data[at] = ord("u")
    damaged = tmp_path / "damaged" / varied.name
    damaged.parent.mkdir()
    damaged.write_bytes(bytes(data))
    with pytest.raises(LogError, match="fails its CRC check"):
        read_log(damaged)
    done = subprocess.run([sys.executable, "-m", "trainguard", "analyze", str(damaged)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "damaged" in done.stderr and "Traceback" not in done.stderr


def _record_offsets(data: bytes) -> list[int]:
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        pos += 16 + struct.unpack_from("<Q", data, pos)[0]
    return offsets


def test_a_damaged_length_field_mid_file_is_corruption_not_a_cut_off(tmp_path: Path) -> None:
    """A record length set to 2^63-1 a tenth into the file points past its end, as a record cut
    off by a killed writer would: only its length CRC tells the two apart, and the NaN at step
    900 must not go unread behind a `healthy`."""
    rows = [(step, "loss", 2.0 if step != 900 else float("nan")) for step in range(1000)]
    intact = event_file(tmp_path / "events.out.tfevents.1.host", rows)
    data = bytearray(intact.read_bytes())
    at = _record_offsets(bytes(data))[100]
    data[at:at + 8] = struct.pack("<Q", 2 ** 63 - 1)
    damaged = tmp_path / "damaged" / intact.name
    damaged.parent.mkdir()
    damaged.write_bytes(bytes(data))
    with pytest.raises(LogError, match=f"at byte {at} fails its CRC check"):
        read_log(damaged)
    done = subprocess.run([sys.executable, "-m", "trainguard", "analyze", str(damaged)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"damaged (the record length at byte {at}" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_record_cut_off_at_the_end_is_still_read_up_to_it(tmp_path: Path) -> None:
    rows = [(step, "loss", 2.0) for step in range(50)]
    intact = event_file(tmp_path / "events.out.tfevents.1.host", rows)
    data = intact.read_bytes()
    last = _record_offsets(data)[-1]
    cut = tmp_path / "cut" / intact.name
    cut.parent.mkdir()
    cut.write_bytes(data[:last + 14])  # its length (and CRC) written, its payload not all
    log = read_log(cut)
    assert log.steps == list(range(49)) and "ends inside a record" in log.notes[-1]


def test_any_piece_size_reads_what_one_piece_reads(varied: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    whole = read_log(varied)
    for piece in (29, 100, 4096):
        monkeypatch.setattr(tensorboard, "_PIECE", piece)
        log = read_log(varied)
        assert log.steps == whole.steps and list(log.series) == list(whole.series)
        assert all(log.series.points(n) == whole.series.points(n) for n in whole.series)


def test_damage_is_placed_at_its_offset_whatever_the_pieces(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             ) -> None:
    rows = [(step, "loss", 2.0) for step in range(300)]
    intact = event_file(tmp_path / "events.out.tfevents.1.host", rows)
    offsets = _record_offsets(intact.read_bytes())
    length = bytearray(intact.read_bytes())
    length[offsets[200]:offsets[200] + 8] = struct.pack("<Q", 2 ** 63 - 1)
    payload = bytearray(intact.read_bytes())
    payload[offsets[250] + 14] ^= 0xFF  # inside the wall time: the record still parses
    for data, what in ((length, f"record length at byte {offsets[200]} fails"),
                       (payload, f"record at byte {offsets[250]} fails")):
        damaged = tmp_path / f"damaged{len(what)}" / intact.name
        damaged.parent.mkdir()
        damaged.write_bytes(bytes(data))
        for piece in (9, 1000, 1 << 24):
            monkeypatch.setattr(tensorboard, "_PIECE", piece)
            with pytest.raises(LogError, match=what):
                read_log(damaged)


def test_a_long_run_is_read_in_windows_as_the_other_readers_read_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(windows, "MAX_ROWS", 8)
    rows = [(step, {"loss": math.nan if step == 70 else 2.0 + step % 3,
                    "grad_norm": 50.0 if step == 41 else 1.0 + step / 100,
                    "learning_rate": step / 1000}) for step in range(100)]
    events = event_file(tmp_path / "events.out.tfevents.1.host",
                        [(step, tag, value) for step, values in rows
                         for tag, value in values.items()])
    log = read_log(events)
    builder = LogBuilder("log", "jsonl")
    for step, values in rows:
        builder.add_values(step, values.items())
    expected = builder.build()
    assert log.steps == expected.steps and log.labels == expected.labels
    assert 70 in log.steps and log.labels is not None and len(log) <= 16
    for name in ("loss", "grad_norm", "lr"):
        got, want = log.values(name), expected.values(name)
        assert repr([round(v, 4) for v in got]) == repr([round(v, 4) for v in want]), name
    assert math.isnan(log.values("loss")[log.steps.index(70)])
    assert log.values("grad_norm")[log.steps.index(47)] == 50.0
    assert any("windows of 8 consecutive rows" in note for note in log.notes)


def test_kohya_sd_scripts_tags_give_the_loss_and_the_onset(tmp_path: Path) -> None:
    """sd-scripts' TensorBoard tags: `loss/current` the step's loss beside `loss/average`, the
    LRs per part (`lr/unet`, `lr/textencoder`), the first part's read as the run's LR, and
    said; the onset at the log's own step."""
    from trainguard.analyze import analyze

    scalars = []
    for step in range(1, 401):
        current = 0.1 + 0.01 * (step % 5) if step < 300 else math.nan
        scalars += [(step, "loss/current", current), (step, "loss/average", 0.12),
                    (step, "lr/unet", 1e-4), (step, "lr/textencoder", 5e-5)]
    result = analyze(event_file(tmp_path / "events.out.tfevents.1.host", scalars))
    assert result.log is not None and result.log.format == "tensorboard"
    assert (result.verdict, result.kind, result.onset_step) == ("degraded", "nan", 300)
    assert result.log.values("lr")[:2] == pytest.approx([1e-4, 1e-4])
    assert "lr/unet is read as the learning rate" in result.log.notes
