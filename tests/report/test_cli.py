"""`trainguard report`: one file written in one piece, or one clear error (exit 2) and nothing
written."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

import pytest

from trainguard.store import DB_NAME

from ..store.helpers import cli, listing, readonly_python, world_readable_dir
from ..test_cli import assert_one_error, call
from .helpers import Synthetic, write_run


def test_report_writes_one_html_file(small_run: Synthetic, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.html"
    code, stdout, err = call("report", str(small_run.run_dir), "--out", str(out), capsys=capsys)
    assert code == 0, err
    assert stdout.startswith(f"wrote {out} (") and "10 plots" in stdout
    assert listing(tmp_path) == {"report.html"}, "no temporary file left"
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</html>\n")
    assert "<script src" not in page and "<link" not in page, "nothing loaded from outside"
    assert "default-src 'none'" in page
    assert out.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_report_replaces_an_old_report_and_reads_an_earlier_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    write_run(run_dir, steps=30, sample_every=5)
    write_run(run_dir, steps=40, sample_every=5)
    out = tmp_path / "r.html"
    out.write_text("old")
    out.chmod(0o640)
    assert call("report", str(run_dir), "--out", str(out), "--run", "1", capsys=capsys)[0] == 0
    page = out.read_text()
    assert "1 of 2 in this directory" in page and "30 recorded (0..29)" in page
    assert out.stat().st_mode & 0o777 == 0o640, "a replaced report keeps its mode"
    assert call("report", str(run_dir), "--out", str(out), capsys=capsys)[0] == 0
    assert "2 of 2 in this directory" in out.read_text()


def _corrupt(path: Path) -> Path:
    path.mkdir()
    (path / DB_NAME).write_bytes(b"SQLite format 3\x00" + b"\x00" * 200)
    return path


def _foreign(path: Path) -> Path:
    path.mkdir()
    with sqlite3.connect(path / DB_NAME) as conn:
        conn.execute("CREATE TABLE other (x)")
    return path


@pytest.mark.parametrize("make_bad, message", [
    (lambda p: p / "missing", "no run directory at"),
    (lambda p: (p / "file").write_text("x") and p / "file", "is not a directory"),
    (lambda p: (p / "empty").mkdir() or p / "empty", "is not a trainguard run"),
    (lambda p: _corrupt(p / "corrupt"), "corrupt"),
    (lambda p: _foreign(p / "foreign"), "not a trainguard store"),
])
def test_bad_run_directories_are_one_error_and_write_nothing(
        tmp_path: Path, make_bad, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = make_bad(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "r.html").write_text("old report")
    code, stdout, err = call("report", str(run_dir), "--out", str(out_dir / "r.html"),
                             capsys=capsys)
    assert_one_error(code, stdout, err, message)
    assert listing(out_dir) == {"r.html"} and (out_dir / "r.html").read_text() == "old report"


def test_a_run_id_that_does_not_exist(small_run: Synthetic, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = call("report", str(small_run.run_dir), "--out", str(tmp_path / "r.html"),
                          "--run", "9", capsys=capsys)
    assert_one_error(code, out, err, "no run 9")
    assert listing(tmp_path) == set()


@pytest.mark.parametrize("where, message", [
    (lambda p: p / "missing" / "r.html", "does not exist"),
    (lambda p: p / "a-file" / "r.html", "is not a directory"),
    (lambda p: p, "is a directory"),
])
def test_out_paths_that_cannot_be_written(small_run: Synthetic, tmp_path: Path, where,
                                          message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a-file").write_text("x")
    code, out, err = call("report", str(small_run.run_dir), "--out", str(where(tmp_path)),
                          capsys=capsys)
    assert_one_error(code, out, err, message)
    assert listing(tmp_path) == {"a-file"}


def test_the_run_store_itself_is_never_overwritten(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    write_run(run_dir, steps=20, sample_every=5)
    before = (run_dir / DB_NAME).read_bytes()
    code, out, err = call("report", str(run_dir), "--out", str(run_dir / DB_NAME),
                          capsys=capsys)
    assert_one_error(code, out, err, "one of the run store's own files")
    assert (run_dir / DB_NAME).read_bytes() == before


def test_a_read_only_directory_is_one_error(small_run: Synthetic) -> None:
    target = world_readable_dir("tg-report-ro-")
    try:
        target.chmod(0o555)
        result = readonly_python(
            "import sys; from trainguard.cli import main; sys.exit(main(sys.argv[1:]))",
            "report", str(small_run.run_dir), "--out", str(target / "r.html"))
        assert_one_error(result.returncode, result.stdout, result.stderr, "cannot write",
                         "Permission denied")
        assert listing(target) == set()
    finally:
        target.chmod(0o755)
        target.rmdir()


def test_a_failed_rename_leaves_nothing_half_way(small_run: Synthetic, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from trainguard.report import output

    out = tmp_path / "r.html"
    out.write_text("old report")

    def fail(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(output.os, "replace", fail)
    code, stdout, err = call("report", str(small_run.run_dir), "--out", str(out), capsys=capsys)
    assert_one_error(code, stdout, err, "cannot write", "No space left on device")
    assert listing(tmp_path) == {"r.html"} and out.read_text() == "old report"


def test_without_plotly_the_error_says_how_to_install_it(small_run: Synthetic, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    monkeypatch.setitem(sys.modules, "plotly", None)
    monkeypatch.setitem(sys.modules, "plotly.offline", None)
    code, out, err = call("report", str(small_run.run_dir), "--out", str(tmp_path / "r.html"),
                          capsys=capsys)
    assert_one_error(code, out, err, "needs the plotly package",
                     "pip install 'trainguard[report]'")
    assert listing(tmp_path) == set()


@pytest.mark.parametrize("args", [["report"], ["report", "x"], ["report", "x", "--out"],
                                  ["report", "x", "--out", "r.html", "--run", "0"]])
def test_bad_arguments_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = call(*args, capsys=capsys)
    assert code == 2 and "Traceback" not in err and err.startswith("trainguard: error: ")


def test_help_states_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = call("report", "--help", capsys=capsys)
    flat = " ".join(out.split())
    assert code == 0 and "--out FILE.html" in flat and "--open" in flat
    assert "exit codes: 0 ok, 2 bad input" in flat


def test_the_command_runs_as_a_process(small_run: Synthetic, tmp_path: Path) -> None:
    result = cli("report", str(small_run.run_dir), "--out", str(tmp_path / "r.html"))
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and (tmp_path / "r.html").stat().st_size > 1_000_000
