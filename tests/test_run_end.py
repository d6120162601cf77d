"""How a run ends: a close while an exception is under way (in a `finally:` clause, a `with`
block's exit) records the run `interrupted` (Ctrl-C, a signal) or `crashed` (any other error),
with the exception's type in the store, `show` and `runs`; a close after an exception the loop
handled is `finished`, and an explicit status is kept."""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainguard import Guard, GuardConfig, RunReader
from trainguard.events import RunError
from trainguard.sinks import Sink

from .conftest import Setup, make_setup
from .store.helpers import child_env, cli

QUIET = GuardConfig(sinks={"console": False}, probes={"preflight": False})


class Ending(Sink):
    """What a sink hears at the end."""

    def __init__(self) -> None:
        self.error: RunError | None = None
        self.status: str | None = None

    def on_run_error(self, error: RunError) -> None:
        self.error = error

    def on_run_end(self, status: str) -> None:
        self.status = status


def train(guard: Guard, setup: Setup, steps: int = 4) -> None:
    for _ in range(steps):
        loss = setup.model.loss(setup.batch())
        loss.backward()
        guard.step(loss)
        setup.optimizer.zero_grad(set_to_none=True)


def started(run_dir: Path) -> tuple[Guard, Setup, Ending]:
    setup, ending = make_setup(), Ending()
    guard = Guard(setup.model, setup.optimizer, config=QUIET, run_dir=run_dir, sinks=[ending])
    return guard, setup, ending


def stored(run_dir: Path) -> tuple[str, dict | None]:
    with RunReader(run_dir) as reader:
        summary = reader.summary()
    return summary["status"], summary["error"]


@pytest.mark.parametrize(("raised", "status"), [(KeyboardInterrupt, "interrupted"),
                                                 (RuntimeError, "crashed")])
def test_a_close_in_finally_during_an_exception_says_how_the_run_ended(
        tmp_path: Path, raised: type[BaseException], status: str) -> None:
    guard, setup, ending = started(tmp_path)
    with pytest.raises(raised):
        try:
            train(guard, setup)
            raise raised("the data loader died\nsecond line")
        finally:
            guard.close()
    assert ending.status == status
    assert ending.error == RunError(raised.__name__, "the data loader died")
    assert stored(tmp_path) == (status, {"type": raised.__name__,
                                         "message": "the data loader died"})
    shown = cli("show", str(tmp_path)).stdout
    assert f"status     {status} by {raised.__name__}: the data loader died (policy" in shown
    listing = cli("runs", str(tmp_path)).stdout.splitlines()[-1]
    assert status in listing and f"ended by {raised.__name__}" in listing, listing


def test_a_close_after_a_handled_exception_is_finished(tmp_path: Path) -> None:
    guard, setup, ending = started(tmp_path)
    try:
        train(guard, setup)
        raise ValueError("a bad batch, skipped by the loop")
    except ValueError:
        pass
    guard.close()
    assert (ending.status, ending.error) == ("finished", None)
    assert stored(tmp_path) == ("finished", None)


def test_an_explicit_status_is_kept(tmp_path: Path) -> None:
    guard, setup, ending = started(tmp_path)
    with pytest.raises(RuntimeError):
        try:
            train(guard, setup)
            raise RuntimeError("raised after the training ended, by the evaluation")
        finally:
            guard.close(status="finished")
    assert (ending.status, ending.error) == ("finished", None)


def test_a_clean_exit_is_no_interruption(tmp_path: Path) -> None:
    guard, setup, ending = started(tmp_path)
    with pytest.raises(SystemExit):
        try:
            train(guard, setup)
            sys.exit(0)
        finally:
            guard.close()
    assert (ending.status, ending.error) == ("finished", None)


def test_a_with_block_ends_with_its_own_exception_not_one_handled_around_it(
        tmp_path: Path) -> None:
    """A `with` block's exit is handed its exception: one that an enclosing `except:` clause is
    handling (a retry) is not the block's."""
    setup, ending = make_setup(), Ending()
    try:
        raise OSError("the first attempt failed")
    except OSError:
        with Guard(setup.model, setup.optimizer, config=QUIET, run_dir=tmp_path / "retry",
                   sinks=[ending]) as guard:
            train(guard, setup)
    assert (ending.status, ending.error) == ("finished", None)
    crashed = Ending()
    with pytest.raises(RuntimeError):
        with Guard(setup.model, setup.optimizer, config=QUIET, run_dir=tmp_path / "crash",
                   sinks=[crashed]) as guard:
            train(guard, setup)
            raise RuntimeError("out of memory")
    assert (crashed.status, crashed.error) == ("crashed", RunError("RuntimeError",
                                                                   "out of memory"))


def test_ctrl_c_in_a_script_that_closes_in_finally(tmp_path: Path) -> None:
    """A real Ctrl-C (SIGINT) during training, in a script written as the README shows."""
    code = textwrap.dedent("""
        import signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal
        import torch, trainguard
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        guard = trainguard.Guard(model, optimizer, run_dir=sys.argv[1],
                                 config=trainguard.GuardConfig(console=False))
        try:
            for step in range(10**9):
                loss = model(torch.randn(8, 4)).square().mean()
                loss.backward()
                guard.step(loss)
                optimizer.zero_grad(set_to_none=True)
                if step == 30:
                    print("ready", flush=True)
        finally:
            guard.close()
    """)
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=child_env())
    assert child.stdout is not None
    try:
        assert select.select([child.stdout], [], [], 120)[0], "the child never got going"
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert "KeyboardInterrupt" in err
    assert stored(tmp_path) == ("interrupted", {"type": "KeyboardInterrupt", "message": ""})
