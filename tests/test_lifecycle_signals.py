"""Signals never deadlock the close: whatever lock the training thread holds when a signal comes,
the process ends within 2 s (5 s for Ctrl-C, whose exit tears the interpreter down) and its run
is "interrupted"; a close under way is finished first;
a swallowed exception or a forked child do not keep the process alive."""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from benchmarks import kill_trials
from trainguard import RunReader, lifecycle

from .store.helpers import child_env

TESTS = str(Path(__file__).parent)
PRELUDE = textwrap.dedent("""
    import os, signal, sys, threading, time
    sys.path.insert(0, {tests!r})
    from trainguard import lifecycle
    from trainguard.store import RunStoreSink
    from store.helpers import run_info, step_report
    run_dir = sys.argv[1]
    sink = RunStoreSink(run_dir)
    sink.on_run_start(run_info(run_dir))
    for step in range(5):
        sink.on_step(step_report(step))
    sink.store.flush()
""")


def _run(tmp_path: Path, body: str, *, timeout: float = 30,
         signum: int = signal.SIGTERM) -> tuple[int, float, str]:
    code = PRELUDE.format(tests=TESTS) + textwrap.dedent(body)
    if signum == signal.SIGINT:  # as a script started from a terminal: a test runner's worker
        # may ignore SIGINT, and a child inherits that (trainguard then leaves it ignored)
        code = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n" + code
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=child_env())
    assert child.stdout is not None
    if not select.select([child.stdout], [], [], 60)[0]:
        child.kill()
    line = child.stdout.readline().strip()
    assert line == "ready", child.communicate()[1]
    start = time.monotonic()
    child.send_signal(signum)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # a hung child must not outlive the test
        child.kill()
        child.communicate()
        raise
    return child.returncode, time.monotonic() - start, out + err


def _status(run_dir: Path) -> str:
    with RunReader(run_dir) as reader:
        return reader.summary()["status"]


def test_a_signal_while_the_training_thread_holds_the_stores_locks(tmp_path: Path) -> None:
    # the deadlock of old: the handler closed the run while the interrupted thread held the
    # lock that closing needs
    code, took, output = _run(tmp_path, """
        store = sink.store
        queue = getattr(store, "_queue", None)
        locks = [getattr(queue, "mutex", None), getattr(store, "_count_lock", None),
                 getattr(store, "_commit_cond", None), lifecycle._lock]
        import contextlib
        with contextlib.ExitStack() as held:   # held as code holds them: in `with` blocks
            for lock in locks:
                if lock is not None:
                    held.enter_context(lock)
            print("ready", flush=True)
            time.sleep(30)
    """)
    assert code == -signal.SIGTERM, output
    assert took < 2.0
    assert _status(tmp_path) == "interrupted"


def test_a_swallowed_exit_still_ends_the_process(tmp_path: Path) -> None:
    code, took, output = _run(tmp_path, """
        print("ready", flush=True)
        while True:
            try:
                time.sleep(30)
            except BaseException:   # a loop that survives everything
                pass
    """)
    assert code == -signal.SIGTERM, output
    assert took < 2.0, "the watcher closed the run and ended the process"
    assert _status(tmp_path) == "interrupted"


def test_a_close_that_hangs_after_ctrl_c_does_not_keep_the_process_alive(tmp_path: Path) -> None:
    """Ctrl-C raises KeyboardInterrupt wherever the main thread is, inside a lock too; the close
    at exit may then wait on that lock forever. The process still ends, as Ctrl-C ends it."""
    code, took, output = _run(tmp_path, """
        broken = threading.Lock()
        broken.acquire()   # as a lock the interrupt left held
        lifecycle.track(lambda status: broken.acquire())
        print("ready", flush=True)
        time.sleep(30)
    """, signum=signal.SIGINT)
    assert code == -signal.SIGINT, output
    assert took < lifecycle.CLOSE_TIMEOUT_S + 2.0
    assert "did not end within" in output


def test_ctrl_c_caught_by_the_loop_leaves_training_going(tmp_path: Path) -> None:
    code, _, output = _run(tmp_path, """
        try:
            print("ready", flush=True)   # inside: the signal comes as soon as it is read
            time.sleep(30)
        except KeyboardInterrupt:   # "press Ctrl-C to stop and save"
            print("caught", flush=True)
        time.sleep(lifecycle.CLOSE_TIMEOUT_S + 1)   # the watcher leaves a process alone
        sink.on_run_end("finished")
        with lifecycle.closing():
            sink.close()
        print("saved", flush=True)
    """, signum=signal.SIGINT)
    assert code == 0, output
    assert "caught" in output and "saved" in output
    assert _status(tmp_path) == "finished"


def test_a_signal_during_the_close_waits_until_the_run_is_closed(tmp_path: Path) -> None:
    code = PRELUDE.format(tests=TESTS) + textwrap.dedent("""
        sink.on_run_end("finished")
        with lifecycle.closing():   # as Run.close: the signal comes in the middle of it
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)
            sink.close()
            print("closed", flush=True)
        print("after the close", flush=True)
    """)
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                            text=True, env=child_env(), timeout=60)
    assert result.returncode == -signal.SIGTERM, result.stderr
    assert "closed" in result.stdout and "after the close" not in result.stdout
    assert _status(tmp_path) == "finished", "the close was not cut short"


def test_a_forked_child_dies_of_the_signal_as_without_trainguard(tmp_path: Path) -> None:
    code, _, output = _run(tmp_path, """
        pid = os.fork()
        if pid == 0:   # a DataLoader worker, say: it inherited the handler
            time.sleep(30)
            os._exit(0)
        time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        print("child", os.WIFSIGNALED(status) and os.WTERMSIG(status), file=sys.stderr)
        print("ready", flush=True)
        time.sleep(30)
    """)
    assert f"child {int(signal.SIGTERM)}" in output
    assert code == -signal.SIGTERM and _status(tmp_path) == "interrupted"


@pytest.mark.slow
def test_signals_at_random_moments_of_a_training_loop() -> None:
    """20 loops (SIGTERM, SIGINT, SIGHUP, SIGQUIT in turn, with and without `with guard:`),
    two at a time, each signalled at a random moment."""
    result = kill_trials.run("signals", 20, step_ms=1.0, max_delay=0.3, seed=1)
    trials = result["trials"]
    assert len(trials) == 20
    for trial in trials:
        # Ctrl-C ends through Python's own exit, which tears the interpreter (torch with it)
        # down: seconds on a loaded machine, none of them trainguard's
        limit = 5.0 if trial["signal"] == "SIGINT" else 2.0
        assert trial["exit_s"] is not None and trial["exit_s"] < limit, trial
        assert trial["status"] == "interrupted", trial
        assert trial["returncode"] == -signal.Signals[trial["signal"]], trial
