"""Opening a log's files: only regular files are read, the files found inside a folder as much
as the path given (a FIFO would block the reader for ever, a link to /dev/zero be read until
memory ran out), and text is read a bounded line at a time."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard.analyze import read_log
from trainguard.analyze.log import LogError
from trainguard.analyze.source import MAX_LINE, MAX_STDIN, WAIT_NOTICE_S, Lines, copy_stdin

from .logs import trainer_state

CLI = [sys.executable, "-m", "trainguard", "analyze"]
MEMORY = 1 << 30
"""The address space a child analysis is allowed: a reader that reads a device without end
fails against it instead of taking the machine's memory."""


def _bounded() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def analyze(*args: str | Path, stdin: int | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True,
                              timeout=30, preexec_fn=_bounded, stdin=stdin,
                              env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"analyze {' '.join(map(str, args))} did not end in 30 s")


def _refused(done: subprocess.CompletedProcess[str], names: Path) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-400:])
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert str(names) in done.stderr and "not a regular file" in done.stderr


@pytest.mark.parametrize("where", ["trainer_state.json", "checkpoint-30/trainer_state.json"])
def test_a_fifo_found_inside_an_hf_folder_is_refused_not_waited_on(tmp_path: Path,
                                                                     where: str) -> None:
    fifo = tmp_path / "run" / where
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    _refused(analyze(tmp_path / "run"), fifo)


@pytest.mark.parametrize(("where", "fmt"), [("checkpoint-30/trainer_state.json", "hf"),
                                            ("version_0/metrics.csv", "lightning")])
def test_a_link_to_dev_zero_inside_a_folder_is_refused_not_read(tmp_path: Path, where: str,
                                                                fmt: str) -> None:
    link = tmp_path / "run" / where
    link.parent.mkdir(parents=True)
    link.symlink_to("/dev/zero")
    _refused(analyze(tmp_path / "run", "--format", fmt), link)


def test_a_regular_log_in_a_checkpoint_folder_is_still_read(tmp_path: Path) -> None:
    (tmp_path / "run" / "checkpoint-30").mkdir(parents=True)
    trainer_state(tmp_path / "run" / "checkpoint-30" / "trainer_state.json")
    log = read_log(tmp_path / "run")
    assert log.format == "hf" and len(log) > 0


def test_lines_are_cut_as_splitlines_cuts_the_whole_text(tmp_path: Path) -> None:
    text = "a\r\nb\rc\n\nd\x0ce\x85f\u2028g\nlast"
    path = tmp_path / "log.txt"
    path.write_bytes(text.encode())
    lines = Lines(path)
    assert list(lines) == text.splitlines() and not lines.ended
    path.write_bytes(b"one\ntwo\n")
    assert list(lines) == ["one", "two"] and lines.ended


def test_a_line_longer_than_the_bound_is_left_out_or_refused(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    path.write_text("iter 1: loss 2.0\n" + "x" * (MAX_LINE * 2 + 5) + "\niter 2: loss 1.9\n")
    lines = Lines(path)
    assert list(lines) == ["iter 1: loss 2.0", "iter 2: loss 1.9"] and lines.long == 1
    log = read_log(path)
    assert log.steps == [1, 2] and any("longer than" in note for note in log.notes)
    with pytest.raises(LogError, match="line 2 is longer than"):
        list(Lines(path, skip_long=False))
    only = tmp_path / "one_line.log"  # dicts printed without a line break between them
    only.write_text("{'loss': 2.0, 'epoch': 0.1}" * (MAX_LINE // 20))
    with pytest.raises(LogError, match=r"no training log lines recognised .*; 1 line\(s\) longer"):
        read_log(only, "text")
    path.write_text("a\n" + "y" * (MAX_LINE * 5) + "\nb\n" + "z" * (MAX_LINE * 3))
    lines = Lines(path)
    assert list(lines) == ["a", "b"] and lines.long == 2 and not lines.ended
    half = MAX_LINE // 2  # a line begun in one piece and ended in the next
    path.write_text("a" * half + "\n" + "w" * (MAX_LINE + 10) + "\nc\n")
    lines = Lines(path)
    assert list(lines) == ["a" * half, "c"] and lines.long == 1 and lines.ended


def test_standard_input_is_copied_within_its_bound(tmp_path: Path) -> None:
    log = b"{'loss': 1.0, 'epoch': 0.1}\n" * 100
    source, copy, said = tmp_path / "in", tmp_path / "copy", tmp_path / "said"
    source.write_bytes(log)
    with source.open("rb") as stream, copy.open("wb") as out, said.open("w") as notice:
        assert copy_stdin(stream, out, notice, limit=len(log)) == len(log)
    assert copy.read_bytes() == log and said.read_text() == ""
    with (source.open("rb") as stream, copy.open("wb") as out, said.open("w") as notice,
          pytest.raises(LogError, match="more than 0 MiB on standard input")):
        copy_stdin(stream, out, notice, limit=len(log) - 1)


@pytest.mark.slow
def test_an_endless_standard_input_is_refused_in_one_line() -> None:
    with open("/dev/zero", "rb") as zero:
        done = analyze("-", stdin=zero.fileno())
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"trainguard: error: <stdin>: more than {MAX_STDIN >> 20} MiB on standard input (a pipe "
        "that never ends?); save the log to a file and give its path"]


@pytest.mark.slow
def test_a_silent_pipe_is_told_what_analyze_waits_for() -> None:
    child = subprocess.Popen([*CLI, "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    time.sleep(WAIT_NOTICE_S + 1.5)  # the pipe open, nothing written yet
    out, err = child.communicate("{'loss': 1.0, 'epoch': 0.1}\n" * 30, timeout=60)
    assert child.returncode == 0, err
    assert err.startswith("trainguard: waiting for a log on standard input")
    assert "verdict    healthy" in out


def test_a_wide_record_is_read_and_one_past_the_record_bound_refused(tmp_path: Path) -> None:
    """A one-record-per-line format keeps records far longer than a text line (a metrics.csv
    header of a column per parameter), up to its own bound."""
    path = tmp_path / "metrics.csv"
    names = [f"grad_norm/layer{i}.weight" for i in range(MAX_LINE // 20)]
    path.write_text("step,train_loss," + ",".join(names) + "\n"
                    + "".join(f"{s},{2.0 - s / 10}" + "," * len(names) + "\n" for s in range(6)))
    assert len(path.read_text().splitlines()[0]) > MAX_LINE
    log = read_log(path)
    assert log.steps == list(range(6)) and log.values("loss")[-1] == pytest.approx(1.5)
    with pytest.raises(LogError, match="line 1 is longer than 1000 characters"):
        list(Lines(path, skip_long=False, max_line=1000))
