"""`trainguard prove SNAPSHOT --factory module:fn`: a crash snapshot's bad step replayed under each
candidate fix, and one clear message (exit code 2) for bad input."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import trainguard
from trainguard import GuardConfig

from .diagnose.factory_for_cli import regression_setup
from .test_cli import FACTORY, assert_one_error, call


def batch_at(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(16, 8, generator=g)
    if step == 20:
        x[6, 1] = float("nan")
    return {"x": x, "y": x[:, :2] * 0.5}


def _train_until_halted(guard, model, optimizer, loss_fn) -> trainguard.TrainingDiverged:
    """The regression run under `halt`, which its bad sample stops within 30 steps."""
    with pytest.raises(trainguard.TrainingDiverged) as info:
        for step in range(30):
            batch = batch_at(step)
            loss = loss_fn(model, batch)
            loss.backward()
            guard.step(loss, batch=batch)
            optimizer.zero_grad(set_to_none=True)
    return info.value


@pytest.fixture(scope="module")
def nan_snapshot(tmp_path_factory) -> str:
    model, optimizer, loss_fn = regression_setup()
    guard = trainguard.Guard(model, optimizer, replay_fn=loss_fn, config=GuardConfig(
        policy="halt", sinks={"console": False}, prove={"mode": "off"},
        checkpoints={"snapshot_dir": str(tmp_path_factory.mktemp("snap"))}))
    halted = _train_until_halted(guard, model, optimizer, loss_fn)
    assert halted.snapshot_path is not None
    return halted.snapshot_path


def test_prove_confirms_the_nan_sample_of_a_crash_snapshot(nan_snapshot: str, capsys) -> None:
    code, out, err = call("prove", nan_snapshot, "--factory", f"{FACTORY}:regression_setup",
                          capsys=capsys)
    assert code == 0, err
    assert out.startswith("snapshot of step 20: nonfinite_input: confirmed by replay: without "
                          "the flagged sample 6 the step's loss is"), out
    assert "(run's typical" in out  # the baseline the snapshot kept
    assert "drop_flagged    heals" in out


def test_prove_bad_input_exits_2(nan_snapshot: str, tmp_path: Path, capsys) -> None:
    garbage = tmp_path / "x.pt"
    garbage.write_bytes(b"junk" * 50)
    for args, fragment in (
            (["prove", str(garbage), "--factory", f"{FACTORY}:regression_setup"], "snapshot"),
            (["prove", nan_snapshot, "--factory", f"{FACTORY}:model_and_loss"],
             "(model, optimizer, loss_fn)"),
            (["prove", nan_snapshot, "--factory", f"{FACTORY}:clean_setup"],
             "loss_fn(model, batch) third"),
            (["prove", nan_snapshot, "--factory", "nocolon"], "")):
        code, out, err = call(*args, capsys=capsys)
        assert_one_error(code, out, err, fragment)


def test_show_and_its_json_say_what_the_replay_confirmed(tmp_path: Path, capsys) -> None:
    import json

    model, optimizer, loss_fn = regression_setup()
    guard = trainguard.Guard(model, optimizer, replay_fn=loss_fn, run_dir=tmp_path / "run",
                             config=GuardConfig(policy="halt", sinks={"console": False}))
    _train_until_halted(guard, model, optimizer, loss_fn)
    code, out, err = call("show", str(tmp_path / "run"), capsys=capsys)
    assert code == 0, err
    assert "nonfinite_input" in out and "confirmed by replay: without the flagged sample 6" in out
    code, out, err = call("show", str(tmp_path / "run"), "--json", capsys=capsys)
    top = json.loads(out)["diagnosis"][0]
    assert top["code"] == "nonfinite_input" and top["proof"] == "confirmed"
    assert top["evidence"][0].startswith("confirmed by replay")


def test_prove_says_a_snapshot_step_replays_as_it_ran(tmp_path: Path, capsys) -> None:
    """A run halted by a divergence whose LR spike lies 13 steps back: the snapshot keeps the
    step's loss, and the replay gives it again (dropout masks included)."""
    from .diagnose.test_anchor import lr_spike_run

    lr_spike_run("halt", "off", checkpoints={"snapshot_dir": str(tmp_path)})
    (snapshot,) = tmp_path.glob("crash_step*.pt")
    code, out, err = call("prove", str(snapshot), "--factory",
                          f"{FACTORY}:regression_setup", capsys=capsys)
    assert code == 0, err
    replayed = re.search(r"as it ran: the plain replay's loss (\S+), the step's recorded (\S+) "
                         r"\(the same: the replay runs as the step did\)", out)
    assert replayed is not None and replayed[1] == replayed[2], out
    # another model under the same snapshot (no dropout): the step does not replay as it ran
    code, out, err = call("prove", str(snapshot), "--factory",
                          f"{FACTORY}:regression_setup_without_dropout", capsys=capsys)
    assert code == 0, err
    assert "(not the same: the replay does not run as the step did" in out, out


def test_a_snapshot_keeps_the_last_good_batch_for_the_previous_batch_fix(
        tmp_path: Path, capsys) -> None:
    """Every sample of step 20's batch is 1e4 times too large (no sample stands out to drop):
    the previous good batch is the fix that tells the data from the state, so the snapshot
    keeps that batch and `prove` tries it offline as the run did."""
    model, optimizer, loss_fn = regression_setup()
    guard = trainguard.Guard(model, optimizer, replay_fn=loss_fn, config=GuardConfig(
        policy="halt", sinks={"console": False}, prove={"mode": "off"},
        checkpoints={"snapshot_dir": str(tmp_path)}))
    with pytest.raises(trainguard.TrainingDiverged) as info:
        for step in range(30):
            batch = batch_at(step + 100)  # no NaN sample
            if step == 20:
                batch = {"x": batch["x"] * 1e4, "y": batch["y"]}
            loss = loss_fn(model, batch)
            loss.backward()
            guard.step(loss, batch=batch)
            optimizer.zero_grad(set_to_none=True)
    guard.close()
    snapshot = trainguard.load_snapshot(info.value.snapshot_path)
    assert info.value.report.step == 20
    assert torch.equal(snapshot["previous_batch"]["x"], batch_at(119)["x"])
    code, out, err = call("prove", info.value.snapshot_path, "--factory",
                          f"{FACTORY}:regression_setup", capsys=capsys)
    assert code == 0, err
    assert re.search(r"previous_batch +heals", out), out
    assert "confirmed by replay: the data — on the previous good batch" in out, out


def test_prove_names_the_fixes_it_could_not_try_from_the_snapshot_s_state(
        tmp_path: Path, capsys) -> None:
    """The loop sets the LR x1000 at step 30; step 31 halts, bad before its own update: the
    snapshot's state is from after the damaging update. `prove` says it could not try the LR
    fixes from there, why, and what would let it (a run with prove="on")."""
    model, optimizer, loss_fn = regression_setup()
    guard = trainguard.Guard(model, optimizer, replay_fn=loss_fn, config=GuardConfig(
        policy="halt", sinks={"console": False}, prove={"mode": "off"},
        checkpoints={"snapshot_dir": str(tmp_path)}))
    with pytest.raises(trainguard.TrainingDiverged) as info:
        for step in range(60):
            if step == 30:
                for group in optimizer.param_groups:
                    group["lr"] *= 1000
            batch = batch_at(step + 100)
            loss = loss_fn(model, batch)
            loss.backward()
            guard.step(loss, batch=batch)
            optimizer.zero_grad(set_to_none=True)
    guard.close()
    code, out, err = call("prove", info.value.snapshot_path, "--factory",
                          f"{FACTORY}:regression_setup", capsys=capsys)
    assert code == 0, err
    assert "could not try lr_x0.1, lr_x0.01, clip (testing lr_too_high) from this state" in out
    assert "is bad before its update" in out
    assert 'a run with prove="on" (it keeps good states from before the damage' in out
    assert re.search(r"lr_x0\.1 +not tried +the step is bad before its update", out), out


def test_prove_imports_a_factory_module_from_the_current_folder(
        nan_snapshot: str, tmp_path: Path, capsys, monkeypatch) -> None:
    """`--factory factory:build` with factory.py in the current folder, as `python -m` would
    import it: the `trainguard` command's own import path does not hold the current folder."""
    import sys

    (tmp_path / "factory.py").write_text(textwrap.dedent("""
        import torch

        def build():
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                        torch.nn.Dropout(0.2), torch.nn.Linear(32, 2))
            return model, torch.optim.AdamW(model.parameters(), lr=1e-2), (
                lambda m, batch: torch.nn.functional.mse_loss(m(batch["x"]), batch["y"]))
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "factory", raising=False)
    try:
        code, out, err = call("prove", nan_snapshot, "--factory", "factory:build",
                              capsys=capsys)
    finally:
        sys.modules.pop("factory", None)
    assert code == 0, err
    assert out.startswith("snapshot of step 20: nonfinite_input: confirmed by replay"), out


# -- --budget bounds the wall time, the user's code included -------------------------------------
@pytest.fixture
def hang_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    started, release = tmp_path / "started", tmp_path / "release"
    monkeypatch.setenv("TRAINGUARD_TEST_STARTED", str(started))
    monkeypatch.setenv("TRAINGUARD_TEST_RELEASE", str(release))
    return started, release


@pytest.mark.parametrize("command, factory, running", [
    ("prove", "hanging_loss_setup", "the factory's loss_fn"),
    ("prove", "hanging_factory", "the factory"),
    ("replay", "hanging_replay_setup", "the factory's loss_fn"),
    ("replay", "hanging_factory", "the factory")])
def test_the_budget_ends_a_hanging_loss_fn_or_factory_with_one_line(
        nan_snapshot: str, hang_files: tuple[Path, Path], capsys, command: str, factory: str,
        running: str) -> None:
    """Before, `prove --budget 3` with a loss_fn that hangs was still running at 60 s."""
    started = time.monotonic()
    try:
        code, out, err = call(command, nan_snapshot, "--factory", f"{FACTORY}:{factory}",
                              "--budget", "1", capsys=capsys)
        took = time.monotonic() - started
    finally:
        hang_files[1].touch()  # the worker left behind ends
    assert_one_error(code, out, err, "the budget of 1 s ended while", f"{running} was")
    assert took < 4, took


_SIGNALS = """
import os, signal, subprocess, sys, time
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal: a test runner's
# worker may ignore SIGINT, and the command would inherit that
child = subprocess.Popen([sys.executable, "-m", "trainguard.cli", *sys.argv[2:]],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
started = Path(os.environ["TRAINGUARD_TEST_STARTED"])
while not started.exists() and child.poll() is None:
    time.sleep(0.05)
if sys.argv[1] != "none":
    child.send_signal(getattr(signal, sys.argv[1]))
began = time.monotonic()
out, err = child.communicate(timeout=60)
print(child.returncode, round(time.monotonic() - began, 2), repr(err))
"""


@pytest.mark.slow
@pytest.mark.parametrize("signal_name, code", [("SIGINT", 130), ("SIGTERM", -15),
                                                ("none", 2)])
def test_under_a_budget_the_command_ends_at_a_signal_or_the_budget(
        nan_snapshot: str, hang_files: tuple[Path, Path], signal_name: str,
        code: int) -> None:
    """As its own process: Ctrl-C and SIGTERM end it at once, the budget's end too (the worker
    left behind does not keep the process)."""
    budget = "3" if signal_name == "none" else "60"
    done = subprocess.run(
        [sys.executable, "-c", _SIGNALS, signal_name, "prove", nan_snapshot, "--factory",
         f"{FACTORY}:hanging_loss_setup", "--budget", budget],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, capture_output=True,
        text=True, timeout=120)
    returncode, seconds, err = done.stdout.split(" ", 2)
    assert int(returncode) == code, (done.stdout, done.stderr[-2000:])
    assert float(seconds) < 5, done.stdout
    assert "Traceback" not in err, err
