"""The command line: demo, show, and one clear message (exit code 2) for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import trainguard
from trainguard import GuardConfig
from trainguard.cli import main

from .conftest import make_setup
from .test_guard import train

SRC = Path(trainguard.__file__).resolve().parents[1]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=120)


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "nan-run"
    setup = make_setup()
    with trainguard.Guard(setup.model, setup.optimizer, run_dir=run_dir,
                          config=GuardConfig(console=False)) as guard:
        train(guard, setup, 20, poison={7: float("nan")})
    return run_dir


def test_show_summarises_a_run(recorded_run: Path, capsys) -> None:
    assert main(["show", str(recorded_run)]) == 0
    out = capsys.readouterr().out
    assert "steps      20 recorded (0..19)" in out
    assert "NaN 1" in out
    assert "nonfinite_loss" in out and "nonfinite_grad" in out
    assert "skipped 1" in out
    assert "worst parameters" in out
    assert "likely causes" in out and "numerical_op" in out, "a NaN loss from a finite batch"


def test_show_json_is_strict_json_with_nan_spelled_out(recorded_run: Path, capsys) -> None:
    assert main(["show", str(recorded_run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(c))
    assert data["steps"] == 20
    assert data["loss"]["nan"] == 1
    assert data["events_by_kind"] == {"nonfinite_loss": 1, "nonfinite_grad": 1}
    nan_event = next(e for e in data["events"] if e["kind"] == "nonfinite_loss")
    assert nan_event["value"] == "nan" and nan_event["step"] == 7


def _corrupt_store(path: Path) -> Path:
    (path / "trainguard.db").write_bytes(b"garbage" * 500)
    return path


@pytest.mark.parametrize("make_bad, message", [
    (lambda p: p / "missing", "no run directory"),
    (lambda p: p, "not a trainguard run"),
    (lambda p: _corrupt_store(p), "corrupt"),
])
def test_show_bad_directories_exit_2_without_traceback(tmp_path: Path, make_bad,
                                                       message: str) -> None:
    result = run_cli("show", str(make_bad(tmp_path)))
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [[], ["show"], ["nonsense"], ["demo", "--steps", "0"],
                                  ["demo", "--steps", "many"]])
def test_bad_arguments_exit_2(args: list[str]) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_help_everywhere() -> None:
    for args in (["--help"], ["demo", "--help"], ["show", "--help"]):
        result = run_cli(*args)
        assert result.returncode == 0 and "usage: trainguard" in result.stdout


def test_demo_runs_healthy_then_exploding(tmp_path: Path) -> None:
    result = run_cli("demo", "--steps", "60", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    err = result.stderr
    assert "healthy" in err and "exploding" in err
    assert "loss_spike" in err, "the explosion is reported as it happens"
    healthy = trainguard.RunReader(tmp_path / "healthy").summary()
    exploding = trainguard.RunReader(tmp_path / "exploding").summary()
    assert healthy["events"] == [] and healthy["status"] == "finished"
    assert exploding["events"] and exploding["loss"]["last"] > 3 * exploding["loss"]["first"]


FACTORY = str(Path(__file__).parent / "diagnose" / "factory_for_cli.py")


def test_replay_a_crash_snapshot_names_the_bad_module(tmp_path: Path) -> None:
    from .diagnose.factory_for_cli import model_and_loss

    model, loss_fn = model_and_loss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = trainguard.Guard(model, optimizer, run_dir=tmp_path,
                             config=GuardConfig(console=False, policy="halt"))
    with torch.no_grad():
        model.blocks.layers[1].linear2.weight[0, 0] = float("nan")
    batch = {"input_ids": torch.randint(0, 32, (4, 9))}
    loss = loss_fn(model, batch)
    loss.backward()
    with pytest.raises(trainguard.TrainingDiverged) as info:
        guard.step(loss, batch=batch)
    result = run_cli("replay", info.value.snapshot_path, "--factory",
                     f"{FACTORY}:model_and_loss")
    assert result.returncode == 0, result.stderr
    assert "first non-finite output: blocks.layers.1.linear2 (Linear)" in result.stdout
    assert "deterministic" in result.stdout


def test_replay_and_doctor_bad_input_exit_2(tmp_path: Path) -> None:
    garbage = tmp_path / "x.pt"
    garbage.write_bytes(b"junk" * 50)
    for args in (["replay", str(garbage), "--factory", f"{FACTORY}:model_and_loss"],
                 ["replay", str(tmp_path / "none.pt"), "--factory", "x:y"],
                 ["doctor", "--factory", "no_such_module_xyz:f"],
                 ["doctor", "--factory", "nocolon"]):
        result = run_cli(*args)
        assert result.returncode == 2, args
        assert "Traceback" not in result.stderr and result.stderr.startswith("trainguard: error")


def test_doctor_audits_a_setup() -> None:
    result = run_cli("doctor", "--factory", f"{FACTORY}:bad_setup")
    assert result.returncode == 0, result.stderr
    assert "ERROR mode_and_lr" in result.stdout and "adam_settings" in result.stdout
    assert "WARNING warmup" in result.stdout
