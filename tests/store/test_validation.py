"""Structurally wrong values in a store give one StoreError (exit code 2 in the CLI), never a
stray TypeError."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from trainguard import RunReader, StoreError
from trainguard.cli import main
from trainguard.store import DB_NAME

from .test_runs import record


def _damage(run_dir: Path, sql: str) -> None:
    conn = sqlite3.connect(run_dir / DB_NAME)
    conn.execute(sql)
    conn.commit()
    conn.close()


DAMAGE: dict[str, tuple[str, str]] = {
    "step not an object": ("UPDATE steps SET data = '[1, 2]' WHERE step = 1", "step 1"),
    "step not JSON": ("UPDATE steps SET data = '{oops' WHERE step = 1", "malformed step 1"),
    "loss a string": ("""UPDATE steps SET data = '{"loss": "low", "action": "applied"}'
                         WHERE step = 0""", "step 0 loss is 'low', expected a number"),
    "config a list": ("UPDATE meta SET value = '[1]' WHERE key = 'config'", "meta config"),
    "param names a dict": ("UPDATE meta SET value = '{}' WHERE key = 'param_names'",
                           "meta param_names"),
    "odd blob": ("UPDATE steps SET grad_norms = x'0102030405' WHERE step = 0",
                 "holds 5 bytes, not a float32 vector"),
    "short blob": ("UPDATE steps SET grad_norms = x'0000803f' WHERE step = 0",
                   "holds 1 values for 3 entries"),
    "event details a list": ("UPDATE events SET details = '[]'", "details"),
    "event message a blob": ("UPDATE events SET message = x'ff00'", "message"),
    "status a blob": ("UPDATE runs SET status = x'07'", "status"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_wrong_values_are_one_clear_error(tmp_path: Path, case: str, capsys) -> None:
    record(tmp_path, 3, loss=1.0, events=1)
    sql, message = DAMAGE[case]
    _damage(tmp_path, sql)
    with pytest.raises(StoreError, match=r"expected|malformed|not a float32|entries") as info:
        with RunReader(tmp_path) as reader:
            reader.summary()
    assert message in str(info.value) and str(tmp_path) in str(info.value)
    for args in (["show", str(tmp_path)], ["show", str(tmp_path), "--json"]):
        assert main(args) == 2
        captured = capsys.readouterr()
        assert captured.out == "", "nothing written"
        assert captured.err.startswith("trainguard: error: ") and captured.err.count("\n") == 1
        assert message in captured.err


@pytest.mark.parametrize("run", [0, 3, -1])
def test_unknown_runs(tmp_path: Path, run: int) -> None:
    record(tmp_path, 1, loss=1.0)
    record(tmp_path, 1, loss=1.0)
    with pytest.raises(StoreError, match=rf"no run {run} in .*\(its runs: 1, 2\)"):
        RunReader(tmp_path, run=run)


def test_reader_methods_check_what_they_read(tmp_path: Path) -> None:
    record(tmp_path, 2, loss=1.0)
    _damage(tmp_path, "UPDATE steps SET step = 'x' WHERE step = 1")
    checks: list[Callable[[RunReader], object]] = [
        lambda r: r.steps(), lambda r: r.scalar("loss"), lambda r: r.param_grad_norms()]
    for check in checks:
        with RunReader(tmp_path) as reader, pytest.raises(StoreError, match="step number"):
            check(reader)
