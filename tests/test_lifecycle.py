"""A run does not stay "running" when its process ends without closing it: SIGTERM, Ctrl-C and a
script that never closes all mark it "interrupted"; user handlers are left alone."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainguard import RunReader, lifecycle

from .store.helpers import child_env, python

TESTS = str(Path(__file__).parent)

CHILD = textwrap.dedent("""
    import os, resource, signal, sys, time
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGQUIT dumps core by default
    # as a script started from a terminal has them (a suite launched in the background or under
    # nohup hands its children SIGINT, SIGQUIT and SIGHUP ignored)
    for name in ("SIGTERM", "SIGHUP", "SIGQUIT"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {tests!r})
    from trainguard.store import RunStoreSink
    from store.helpers import run_info, step_report
    run_dir, mode = sys.argv[1], sys.argv[2]
    if mode == "user-handler":
        def on_term(signum, frame):
            print("user handler", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, on_term)
    sink = RunStoreSink(run_dir)
    sink.on_run_start(run_info(run_dir))
    for step in range(5):
        sink.on_step(step_report(step))
    sink.store.flush()
    if mode == "close":
        sink.on_run_end("finished")
        sink.close()
    elif mode == "halted-no-close":
        sink.on_run_end("halted")
    elif mode in ("wait", "user-handler"):
        print("ready", flush=True)
        time.sleep(600)
""")


def _start(run_dir: Path, mode: str) -> subprocess.Popen:
    code = CHILD.format(tests=TESTS)
    return subprocess.Popen([sys.executable, "-c", code, str(run_dir), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())


def _status(run_dir: Path) -> tuple[str, int, float | None]:
    with RunReader(run_dir) as reader:
        summary = reader.summary()
    return summary["status"], summary["steps"], summary["ended"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                                    signal.SIGQUIT])
def test_a_signal_marks_the_run_interrupted(tmp_path: Path, signum: int) -> None:
    child = _start(tmp_path, "wait")
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    child.send_signal(signum)
    _, err = child.communicate(timeout=60)
    assert child.returncode == -signum, f"the process still ends as killed by {signum}: {err}"
    status, steps, ended = _status(tmp_path)
    assert status == "interrupted" and steps == 5 and ended is not None


@pytest.mark.parametrize("mode, status", [("exit", "interrupted"), ("close", "finished"),
                                          ("halted-no-close", "halted")])
def test_exit_without_close(tmp_path: Path, mode: str, status: str) -> None:
    child = _start(tmp_path, mode)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    assert _status(tmp_path)[:2] == (status, 5)


def test_a_user_sigterm_handler_is_chained_to(tmp_path: Path) -> None:
    child = _start(tmp_path, "user-handler")
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=60)
    assert "user handler" in out and child.returncode == 3, err
    assert _status(tmp_path)[0] == "interrupted", "its sys.exit still closes the run at exit"


def test_handlers_wrap_the_default_and_the_users_but_not_an_ignored_signal() -> None:
    result = python("""
        import signal, threading
        from trainguard import lifecycle
        for name in ("SIGHUP", "SIGQUIT"):  # as from a terminal, whatever launched the suite
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        def mine(signum, frame):
            pass
        signal.signal(signal.SIGTERM, mine)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)   # nohup
        thread = threading.Thread(target=lifecycle.track, args=(lambda status: None,))
        thread.start()
        thread.join()
        print(signal.getsignal(signal.SIGTERM) is mine)   # not from a thread
        lifecycle.track(lambda status: None)
        print(signal.getsignal(signal.SIGTERM) is lifecycle._on_signal,
              lifecycle._previous[signal.SIGTERM] is mine)
        print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN)
        print(signal.getsignal(signal.SIGQUIT) is lifecycle._on_signal,
              lifecycle._previous[signal.SIGQUIT] is signal.SIG_DFL)
        print(lifecycle._previous[signal.SIGINT] is signal.default_int_handler)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True"] * 7


def test_close_all_runs_each_closer_once_newest_first_despite_failures(caplog,
                                                                      monkeypatch) -> None:
    monkeypatch.setattr(lifecycle, "_tracked", [])  # runs other tests left open are not ours
    calls: list[tuple[str, str]] = []

    def closer(name: str, fail: bool = False):
        def close(status: str) -> None:
            calls.append((name, status))
            if fail:
                raise RuntimeError(f"{name} broke")
        return close

    first = lifecycle.track(closer("first"))
    lifecycle.track(closer("broken", fail=True))
    third = lifecycle.track(closer("third"))
    lifecycle.untrack(third)
    lifecycle.untrack(third)  # twice: harmless
    with caplog.at_level(logging.ERROR, logger="trainguard"):
        assert lifecycle.close_all("interrupted") == 2
    assert calls == [("broken", "interrupted"), ("first", "interrupted")]
    assert any("broken" in r.getMessage() for r in caplog.records)
    assert lifecycle.close_all("interrupted") == 0, "closed once"
    lifecycle.untrack(first)  # after closing: harmless
    assert calls == [("broken", "interrupted"), ("first", "interrupted")]
