"""Hostile stores: a real run whose store was then rewritten to make the reader recurse without
end or allocate without bound. `show`, `show --json` and `report` give one line and exit 2, in
bounded memory, and write nothing."""

from __future__ import annotations

import resource
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import trainguard
from trainguard import RunReader, StoreError
from trainguard.cli import main
from trainguard.config import GuardConfig
from trainguard.store import DB_NAME, reader

from .helpers import child_env

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Guard's run of a tiny model: 12 steps, a NaN loss at step 5 (an event and a skip),
    sampled per-parameter and per-module metrics."""
    run_dir = tmp_path_factory.mktemp("hostile") / "run"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with trainguard.Guard(model, optimizer, run_dir=run_dir,
                          config=GuardConfig(sinks={"console": False})) as guard:
        for step in range(12):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            if step == 5:
                loss = loss * float("nan")
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad()
    return run_dir


def _hostile(real_run: Path, tmp_path: Path, script: str, args: tuple = ()) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(real_run, run_dir)
    conn = sqlite3.connect(run_dir / DB_NAME)
    if args:
        conn.execute(script, args)
    else:
        conn.executescript(script)
    conn.commit()
    conn.close()
    return run_dir


GENERATED = """
    ALTER TABLE steps RENAME TO old_steps;
    CREATE TABLE steps (run_id INTEGER NOT NULL, step INTEGER NOT NULL, time REAL NOT NULL,
        data TEXT NOT NULL, grad_norms BLOB GENERATED ALWAYS AS (zeroblob(400000000)) VIRTUAL,
        PRIMARY KEY (run_id, step));
    INSERT INTO steps (run_id, step, time, data) SELECT run_id, step, time, data FROM old_steps;
    DROP TABLE old_steps;
    VACUUM;
"""

CASES: dict[str, tuple[str, tuple, str]] = {
    "deep meta": ("UPDATE meta SET value = ? WHERE key = 'config'", (DEEP,),
                  "meta config nests arrays or objects deeper than 64 levels"),
    "deep event details": ("UPDATE events SET details = ?", ('{"a": ' + DEEP + "}",),
                           "details nests arrays or objects deeper than 64 levels"),
    "deep event value": ("UPDATE events SET value = ?", (DEEP,),
                         "value nests arrays or objects deeper than 64 levels"),
    "deep step": ("UPDATE steps SET data = ? WHERE step = 2", ('{"x": ' + DEEP + "}",),
                  "step 2 nests arrays or objects deeper than 64 levels"),
    "deep action details": ("UPDATE actions SET details = ?", (DEEP,),
                            "details nests arrays or objects deeper than 64 levels"),
    "deep verdict": ("UPDATE meta SET value = ? WHERE key = 'verdict'", (DEEP,),
                     "deeper than 64 levels"),
    "deep error": ("INSERT INTO meta VALUES (1, 'error', ?)", (DEEP,), "deeper than 64 levels"),
    "odd error": ("INSERT INTO meta VALUES (1, 'error', ?)", ('{"type": 3, "message": ""}',),
                  "expected the exception that ended the run (its type and message)"),
    "deep module names": ("UPDATE module_metrics SET names = ?", (DEEP,),
                          "module names nests arrays or objects deeper than 64 levels"),
    "large step": ("""UPDATE steps SET data = '{"loss": 1.0, "x": "' ||
                      hex(zeroblob(9000000)) || '"}' WHERE step = 4""", (),
                   "step 4 is 17.2 MiB, over trainguard's limit of 16.0 MiB for one value"),
    "large event details": ("""UPDATE events SET details = '{"x": "' || hex(zeroblob(9000000))
                               || '"}'""", (), "details is 17.2 MiB, over trainguard's limit"),
    "large action details": ("""UPDATE actions SET details = '{"x": "' ||
                                hex(zeroblob(9000000)) || '"}'""", (),
                             "details is 17.2 MiB, over trainguard's limit"),
    "large module names": ("""UPDATE module_metrics SET names = '["' || hex(zeroblob(9000000))
                              || '"]' WHERE metric = 'act_zero_frac'""", (),
                           "module names is 17.2 MiB, over trainguard's limit"),
    "large verdict": ("""UPDATE meta SET value = '"' || hex(zeroblob(9000000)) || '"'
                         WHERE key = 'verdict'""", (), "verdict is 17.2 MiB, over trainguard's "
                                                       "limit of 16.0 MiB"),
    "large meta value": ("UPDATE meta SET value = '\"' || hex(zeroblob(9000000)) || '\"' "
                         "WHERE key = 'trainguard_version'", (),
                         "meta trainguard_version is 17.2 MiB, over trainguard's limit of "
                         "16.0 MiB for one value"),
    "large meta in all": ("""UPDATE meta SET value = '"' || hex(zeroblob(6000000)) || '"'
                             WHERE key IN ('trainguard_version', 'status', 'param_shapes')""",
                          (), "its meta is 34.3 MiB, over trainguard's limit of 32.0 MiB for a "
                              "run's meta"),
    "stored zeroblob": ("UPDATE steps SET grad_norms = zeroblob(4000000) WHERE step = 3", (),
                        "gradient norms of step 3 holds 3.8 MiB, more than the 16 bytes of 4 "
                        "float32 values"),
    "large param metric": ("UPDATE param_metrics SET data = zeroblob(4000000) "
                           "WHERE metric = 'update_ratio'", (),
                           "update_ratio of step 0 holds 3.8 MiB, more than the 16 bytes of 4"),
    "large module metric": ("UPDATE module_metrics SET data = zeroblob(4000000) "
                            "WHERE metric = 'act_zero_frac'", (),
                            "act_zero_frac of step 0 holds 3.8 MiB, more than one float32 "
                            "value per module"),
    "generated column": (GENERATED, (), "its column steps.grad_norms is computed, not stored"),
    "virtual table": ("DROP TABLE actions; CREATE VIRTUAL TABLE actions USING fts5(run_id, "
                      "step, kind, message, details);", (), "its table actions is a virtual "
                                                           "table"),
}


def _assert_one_error(code: int, out: str, err: str, message: str) -> None:
    assert code == 2, err
    assert out == "", "nothing written on stdout"
    assert err.startswith("trainguard: error: ") and err.count("\n") == 1, err
    assert message in err, err


ONLY_REPORT = {"deep module names", "large param metric", "large module metric",
               "large module names"}
"""Sampled metrics: only the report reads them."""
RUNS_TOO = {"deep verdict", "large verdict", "deep error", "odd error", "generated column",
            "virtual table"}
"""What `trainguard runs` reads too (the listing reads each run's verdict and error)."""


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_store_is_one_error_with_its_limit(real_run: Path, tmp_path: Path, case: str,
                                                     capsys) -> None:
    script, args, message = CASES[case]
    run_dir = _hostile(real_run, tmp_path, script, args)
    out_file = tmp_path / "report.html"
    commands = {"show": ["show", str(run_dir)], "json": ["show", str(run_dir), "--json"],
                "runs": ["runs", str(run_dir)],
                "report": ["report", str(run_dir), "--out", str(out_file)]}
    reading = ({"report"} if case in ONLY_REPORT
               else {"show", "json", "report"} | ({"runs"} if case in RUNS_TOO else set()))
    for name, command in commands.items():
        code = main(command)
        captured = capsys.readouterr()
        if name in reading:
            _assert_one_error(code, captured.out, captured.err, message)
        else:
            assert code == 0, captured.err  # it does not read the damaged part
    assert not out_file.exists(), "no half-written report"


def test_the_real_run_reads(real_run: Path, tmp_path: Path, capsys) -> None:
    """The hostile cases above are refused for what was changed, not for the run itself."""
    assert main(["show", str(real_run), "--json"]) == 0
    assert main(["report", str(real_run), "--out", str(tmp_path / "r.html")]) == 0
    capsys.readouterr()


@pytest.mark.skipif(not hasattr(sqlite3.Connection, "setlimit"), reason="Python 3.11+")
def test_sqlite_refuses_any_value_over_the_limit(real_run: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A value no other check reads first (an event's message) meets SQLite's own limit."""
    run_dir = _hostile(real_run, tmp_path, "UPDATE events SET message = hex(zeroblob(600000))")
    monkeypatch.setattr(reader, "MAX_VALUE_BYTES", 1 << 20)
    with pytest.raises(StoreError, match=r"holds a value larger than 1.0 MiB, trainguard's "
                                         r"limit for one stored value"):
        with RunReader(run_dir) as read:
            read.events()
    code = main(["show", str(run_dir)])
    captured = capsys.readouterr()
    _assert_one_error(code, captured.out, captured.err, "larger than 1.0 MiB")


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@pytest.mark.parametrize("case", ["generated column", "stored zeroblob", "deep meta"])
def test_hostile_stores_stay_under_1_gib(real_run: Path, tmp_path: Path, case: str) -> None:
    """The 60 KB store whose generated column makes 400 MB per step took 5.5 GB for 12 steps
    (80 GB for 200) before it was refused; now a process limited to 1 GiB refuses it."""
    script, args, message = CASES[case]
    run_dir = _hostile(real_run, tmp_path, script, args)
    for command in (["show", str(run_dir)], ["report", str(run_dir), "--out",
                                               str(tmp_path / "r.html")]):
        result = subprocess.run([sys.executable, "-m", "trainguard", *command],
                                capture_output=True, text=True, env=child_env(), timeout=120,
                                preexec_fn=_limit_memory)
        _assert_one_error(result.returncode, result.stdout, result.stderr, message)


def test_brackets_inside_strings_do_not_count() -> None:
    nested = '{"a": ' * 64 + "1" + "}" * 64
    assert not reader._json_depth_over(nested, 64)
    assert reader._json_depth_over("[" + nested + "]", 64)
    quoted = '["' + "[{" * 1000 + '\\"[", "]]]"]'
    assert not reader._json_depth_over(quoted, 64)
    assert not reader._json_depth_over('["unterminated ' + "[" * 100, 64)
