"""A long log in bounded memory: past `2 * MAX_ROWS` rows a reader keeps windows of rows, each
summed up so that nothing hides a NaN or a spike; what a reader keeps, and the analysis after
it, stop growing with the log's length."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.analyze import analyze, windows
from trainguard.analyze.log import LogBuilder


@pytest.fixture
def few_rows(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(windows, "MAX_ROWS", 8)
    return 8


def test_rows_past_the_bound_are_summed_up_in_windows(few_rows: int) -> None:
    builder = LogBuilder("log", "text:nanogpt", step_unit="iter")
    for step in range(100):
        loss = math.nan if step == 70 else 2.0 + step % 2
        builder.add(step, {"loss": loss, "grad_norm": 50.0 if step == 41 else 1.0,
                           "lr": step / 1000}, skipped=step in (96, 97, 98))
    log = builder.build()
    assert len(log) <= 2 * few_rows and builder.stride == 8
    assert log.steps[:2] == [7, 15] and log.labels is not None
    assert log.labels[:2] == ["iter 0 to iter 7", "iter 8 to iter 15"]
    losses = log.values("loss")
    assert losses[0] == 2.5  # the mean of its rows
    assert log.values("lr")[0] == 0.007  # the last
    window = log.steps.index(71) if 71 in log.steps else None
    assert window is None and 70 in log.steps  # a NaN's window is named by its step
    assert math.isnan(losses[log.steps.index(70)])
    assert log.labels[log.steps.index(70)] == "iter 64 to iter 71"
    assert log.values("grad_norm")[log.steps.index(47)] == 50.0  # the largest
    assert log.skipped is not None and log.skipped[-1]  # 3 of the last 4 rows skipped
    assert not any(log.skipped[:-1])
    assert any("windows of 8 consecutive rows" in note for note in log.notes)


def test_a_log_within_the_bound_is_kept_row_by_row(few_rows: int) -> None:
    builder = LogBuilder("log", "jsonl")
    for step in range(2 * few_rows - 1):
        builder.add(step, {"loss": 1.0})
    log = builder.build()
    assert log.steps == list(range(2 * few_rows - 1)) and log.labels is None and not log.notes


def _nanogpt(path: Path, rows: int, nan_from: int | None = None) -> Path:
    with path.open("w") as out:
        for step in range(rows):
            loss = 2.0 + 8.0 * math.exp(-step / 500) + 0.01 * (step % 7)
            if nan_from is not None and step >= nan_from:
                loss = math.nan
            out.write(f"iter {step}: loss {loss:.4f}, time 101.2ms, mfu 14.12%\n")
    return path


def test_the_verdict_of_a_long_log_read_in_windows(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(windows, "MAX_ROWS", 256)
    healthy = analyze(_nanogpt(tmp_path / "healthy.log", 5000))
    assert healthy.verdict == "healthy" and healthy.rows <= 512
    nan = analyze(_nanogpt(tmp_path / "nan.log", 5000, nan_from=4003))
    assert (nan.verdict, nan.kind, nan.onset_step) == ("degraded", "nan", 4003)
    assert nan.onset is not None and nan.onset.endswith("to iter 4015")


GROWTH = """
import sys
from pathlib import Path
from trainguard.analyze import windows
windows.MAX_ROWS = 1 << 10
from trainguard.analyze.analysis import analyze

def peak_mb():  # the process's own high-water mark (getrusage's carries the parent's over exec)
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("VmHWM:"))) // 1024

before = peak_mb()
result = analyze(sys.argv[1])
print(result.verdict, result.rows, peak_mb() - before)
"""


def _hf(path: Path, rows: int) -> Path:
    history = [{"epoch": step / 1000, "grad_norm": 1.0, "learning_rate": 1e-4,
                "loss": 2.0 + 0.01 * (step % 7), "step": step} for step in range(rows)]
    path.write_text(json.dumps({"global_step": rows, "log_history": history}))
    return path


def _jsonl(path: Path, rows: int) -> Path:
    path.write_text("".join(f'{{"step": {step}, "loss": {2.0 + 0.01 * (step % 7)}}}\n'
                            for step in range(rows)))
    return path


def _csv(path: Path, rows: int) -> Path:
    path.write_text("epoch,step,train_loss_step\n" + "".join(
        f"0,{step},{2.0 + 0.01 * (step % 7)}\n" for step in range(rows)))
    return path


def assert_analysed_in_bounded_memory(path: Path) -> None:
    """`path` analysed in a process of its own: healthy, at most 2k rows kept, under 40 MB
    added to the process."""
    done = subprocess.run([sys.executable, "-c", GROWTH, str(path)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    verdict, rows, grown_mb = done.stdout.split()
    assert verdict == "healthy" and int(rows) <= 2048
    assert int(grown_mb) < 40, f"the analysis took {grown_mb} MB more"


@pytest.mark.slow
@pytest.mark.parametrize("writer", [_nanogpt, _hf, _jsonl, _csv],
                         ids=["text", "hf", "jsonl", "lightning"])
def test_memory_does_not_grow_with_the_log(tmp_path: Path, writer) -> None:
    """200k rows (4-15 MB) analysed with windows past 2k rows: the memory the analysis adds
    to the process is that of 2k rows, not of 200k (which took 100-300 MB)."""
    path = writer(tmp_path / "log", 200_000)
    assert_analysed_in_bounded_memory(path)


@pytest.mark.slow
def test_memory_does_not_grow_with_a_tensorboard_log(tmp_path: Path) -> None:
    """As above, for an event file of 200k steps of a loss and a gradient norm (16 MB)."""
    from .logs import event_file

    path = event_file(tmp_path / "events.out.tfevents.1.host",
                      [(step, tag, value) for step in range(200_000)
                       for tag, value in (("loss", 2.0 + 0.01 * (step % 7)), ("grad_norm", 1.0))])
    assert_analysed_in_bounded_memory(path)
