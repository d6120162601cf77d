"""Runs that end with their process: none stays "running" forever.

A run whose process ends without `guard.close()` (a script that forgot it, Ctrl-C, SIGTERM from
a scheduler, SIGHUP from a closed terminal) is closed with the status "interrupted":

- at interpreter exit (`atexit`), which also covers Ctrl-C: the KeyboardInterrupt ends the
  process through Python's normal exit path (every exit hook, then death by SIGINT);
- on SIGTERM, SIGHUP and SIGQUIT whose handler is the default one: trainguard's handler turns
  the signal into `SystemExit` in the main thread, so `with guard:` blocks, `finally` clauses and
  the exit close the run as for Ctrl-C, and the process then ends as killed by that signal;
- a handler the user (or a framework) installed before the run is kept and called: trainguard's
  handler chains to it and does nothing else, so a handler that lets training go on keeps it
  going. A signal set to be ignored (`nohup`) stays ignored.

Why the handler closes nothing itself: it interrupts the main thread between two bytecodes,
possibly inside a lock (the store's queue, logging's, a file's), and closing from there could
wait on that very lock forever. It takes no lock: it only raises, or defers while trainguard is
closing a run (so a run is never left half closed) and raises when the close ends. A watcher
thread, woken through a pipe, makes sure the process still ends: if the main thread swallowed
the exception or is stuck, it closes the runs itself after `GRACE_S` and ends the process.
Ctrl-C is Python's KeyboardInterrupt, which a loop may catch and train on: the watcher ends the
process (as Ctrl-C would) only when a close of trainguard's after it runs past `CLOSE_TIMEOUT_S`
(the interrupt came inside a lock that close needs, and it would wait forever).

SIGKILL cannot be caught: such a run stays "running", and the store lacks at most its last few
steps (`trainguard.store.writer.MAX_UNCOMMITTED_STEPS`).

    handle = lifecycle.track(close)   # close(status) ends and closes the run
    ...
    lifecycle.untrack(handle)         # after a normal close

Closers run at most once each, newest first; one that raises is logged and the others still run.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from trainguard.vocabulary import Status

log = logging.getLogger("trainguard")

INTERRUPTED: Status = "interrupted"
SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
                if hasattr(signal, name))
"""The signals whose handler trainguard wraps."""
GRACE_S = 1.0
"""Seconds the main thread has, after a fatal signal, to start closing its runs (or end)
before the watcher closes them itself and ends the process."""
CLOSE_TIMEOUT_S = 5.0
"""Seconds from a fatal signal after which the process ends even if a close is still under way."""


class RunHandle:
    """A tracked run: its closer and the process that tracked it."""

    __slots__ = ("close", "pid")

    def __init__(self, close: Callable[[Status], None]) -> None:
        self.close = close
        self.pid = os.getpid()

    def __repr__(self) -> str:
        return f"RunHandle({self.close!r}, pid={self.pid})"


_lock = threading.RLock()
_tracked: list[RunHandle] = []

# Signal state. The handler reads and writes only these plain values (no lock): it may run while
# the main thread holds any lock.
_previous: dict[int, Any] = {}
"""The handler each wrapped signal had before trainguard's."""
_owner_pid: int | None = None
"""The process whose handlers and watcher these are (a forked child inherits the handlers)."""
_shield_depth = 0
"""How deep the main thread is in trainguard's closing code (`closing()`)."""
_deferred: list[int] = []
"""Signals that came while the main thread was closing a run: handled when it is done."""
_fatal: int | None = None
"""The signal this process must end of, once its runs are closed."""
_fatal_at = 0.0
_raised = False
"""SystemExit was raised for `_fatal` (a second fatal signal then ends the process at once)."""
_exiting = False
"""The exit close runs (atexit)."""
_wake_w = -1
_watcher: threading.Thread | None = None


def track(close: Callable[[Status], None]) -> RunHandle:
    """Close this run with `close("interrupted")` if the process ends before `untrack`."""
    handle = RunHandle(close)
    with _lock:
        _tracked.append(handle)
    _install_handlers()
    return handle


def untrack(handle: RunHandle) -> None:
    """The run was closed normally: forget it (unknown or repeated handles are ignored)."""
    with _lock:
        if handle in _tracked:
            _tracked.remove(handle)


def tracked() -> int:
    """How many runs of this process are tracked."""
    with _lock:
        return sum(1 for h in _tracked if h.pid == os.getpid())


def close_all(status: Status = INTERRUPTED) -> int:
    """Close every tracked run of this process with `status`, newest first; returns how many
    closers ran. Each is called once, and a failing one does not stop the others."""
    with closing():
        with _lock:
            pid = os.getpid()
            handles = [h for h in reversed(_tracked) if h.pid == pid]
            _tracked[:] = [h for h in _tracked if h.pid != pid]
        for handle in handles:
            try:
                handle.close(status)
            except Exception as exc:  # one broken closer must not keep the others open
                log.error("trainguard: closing a run at exit failed (%s: %s)",
                          type(exc).__name__, exc)
    return len(handles)


def close_open_runs() -> int:
    """Close every run this process left open (a Guard or callback no longer at hand, as after
    re-running a notebook cell that made one) as `interrupted`, freeing their run directories;
    returns how many were closed. A Guard closed so refuses further steps."""
    return close_all(INTERRUPTED)


@contextmanager
def closing() -> Iterator[None]:
    """Around trainguard's own closing code: a signal that comes meanwhile is handled when the
    close is done, so a run is never left half closed by the exception it raises."""
    global _shield_depth
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers run in the main thread only
        return
    _shield_depth += 1
    try:
        yield
    finally:
        _shield_depth -= 1
        if _shield_depth == 0 and _deferred and not _exiting:
            pending = list(_deferred)
            _deferred.clear()
            for signum in pending:
                _dispatch(signum, None)


def _close_at_exit() -> None:
    global _exiting
    _exiting = True
    close_all(INTERRUPTED)
    for signum in _deferred:  # came during this close: end of it as the default would
        if _previous.get(signum) == signal.SIG_DFL and _fatal is None:
            _mark_fatal(signum)
    if os.getpid() != _owner_pid:
        return
    if _fatal is not None:  # the default action would have ended the process at the signal
        _end_process(_fatal)
    # An uncaught Ctrl-C is left to Python: it runs every other exit hook, tears the
    # interpreter down and then dies of SIGINT, as without trainguard.


# -- signals ---------------------------------------------------------------------------------
def _install_handlers() -> None:
    """Wrap the handlers of `SIGNALS` (from the main thread only; once per process)."""
    global _owner_pid
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    if _owner_pid == os.getpid():
        return
    for signum in SIGNALS:
        try:
            current = signal.getsignal(signum)
            if current is _on_signal:  # inherited over a fork: the previous one is known
                continue
            if current is None or current == signal.SIG_IGN:
                continue  # set outside Python, or ignored on purpose (nohup): left alone
            signal.signal(signum, _on_signal)
            _previous[signum] = current
        except (ValueError, OSError):  # an interpreter without signals
            continue
    _owner_pid = os.getpid()
    _start_watcher()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # Runs in the main thread between two bytecodes, maybe inside a lock: takes no lock.
    if os.getpid() != _owner_pid:  # a forked child (a DataLoader worker): as without us
        _as_previous(signum, frame)
        return
    if _shield_depth > 0:
        _deferred.append(signum)
        if _previous.get(signum) == signal.SIG_DFL and _fatal is None:
            _mark_fatal(signum)  # the watcher bounds how long the close may take
        return
    _dispatch(signum, frame)


def _dispatch(signum: int, frame: FrameType | None) -> None:
    global _raised
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):  # the user's handler, or Python's KeyboardInterrupt for SIGINT
        if signum == getattr(signal, "SIGINT", None):
            _wake_watcher()  # a close the interrupt leads to must not hang the process
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    if _raised:  # a second signal while the first unwinds: end now, as the default would
        _end_process(signum)
        return
    if _fatal is None:
        _mark_fatal(signum)
    _raised = True
    raise SystemExit(128 + signum)


def _mark_fatal(signum: int) -> None:
    global _fatal, _fatal_at
    _fatal, _fatal_at = signum, time.monotonic()
    _wake_watcher()


def _wake_watcher() -> None:
    try:  # a write to a non-blocking pipe takes no lock
        os.write(_wake_w, b"!")
    except OSError:
        pass


def _as_previous(signum: int, frame: FrameType | None) -> None:
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        _end_process(signum)


def _end_process(signum: int) -> None:
    """End the process as killed by `signum` (the default action), from any thread."""
    if threading.current_thread() is threading.main_thread():
        try:
            logging.shutdown()  # its own atexit hook may not run: flush the log files
        except Exception:  # a broken handler must not keep the process alive
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or broken stream: nothing to save
            pass
    try:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signum, signal.SIG_DFL)
        else:  # Python sets handlers from the main thread only; the C library does not care
            ctypes.CDLL(None).signal(signum, ctypes.c_void_p(0))  # 0 is SIG_DFL
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
        time.sleep(1.0)  # delivery is asynchronous from another thread
    except Exception:  # no way to die of the signal here: exit with the shell's code for it
        pass
    os._exit(128 + signum)


def _start_watcher() -> None:
    global _wake_w, _watcher
    try:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
    except OSError:
        return
    _wake_w = write_fd
    _watcher = threading.Thread(target=_watch, args=(read_fd,), name="trainguard-signals",
                                daemon=True)
    _watcher.start()


def _watch(read_fd: int) -> None:
    """After a fatal signal: give the main thread `GRACE_S` to start closing (and a close
    under way up to `CLOSE_TIMEOUT_S`), then close the runs from here and end the process.
    After Ctrl-C (a KeyboardInterrupt, which a loop may catch and train on): end the process
    as Ctrl-C would only if a close of trainguard's then runs for `CLOSE_TIMEOUT_S` (the
    interrupt may have come inside a lock that close needs)."""
    try:
        if not os.read(read_fd, 1):
            return
    except OSError:
        return
    closing_since: float | None = None
    while _fatal is None:
        time.sleep(0.05)
        if _shield_depth == 0 and not _exiting:
            closing_since = None
            continue
        closing_since = closing_since or time.monotonic()
        if time.monotonic() - closing_since > CLOSE_TIMEOUT_S and os.getpid() == _owner_pid:
            log.error("trainguard: closing the run after Ctrl-C did not end within %.0f s "
                      "(the interrupt came inside a lock it needs); the process ends without "
                      "it", CLOSE_TIMEOUT_S)
            _end_process(signal.SIGINT)
    while True:
        time.sleep(0.02)
        waited = time.monotonic() - _fatal_at
        if waited > CLOSE_TIMEOUT_S:
            break
        if waited > GRACE_S and _shield_depth == 0 and not _exiting:
            break  # the main thread is not closing: it swallowed the exception or is stuck
    if _fatal is None or os.getpid() != _owner_pid:
        return
    closer = threading.Thread(target=close_all, args=(INTERRUPTED,), daemon=True,
                              name="trainguard-signal-close")
    closer.start()
    closer.join(max(0.5, CLOSE_TIMEOUT_S - (time.monotonic() - _fatal_at)))
    _end_process(_fatal)


def _after_fork_in_child() -> None:
    global _lock, _wake_w, _watcher, _shield_depth, _fatal, _raised, _exiting
    _lock = threading.RLock()  # another thread may have held it at fork
    _tracked.clear()  # the parent's runs are the parent's to close
    if _wake_w >= 0:
        try:
            os.close(_wake_w)
        except OSError:
            pass
    _wake_w, _watcher = -1, None  # the parent's watcher did not come along
    _shield_depth, _fatal, _raised, _exiting = 0, None, False, False
    _deferred.clear()


# Registered at import, before most other exit hooks: the hooks registered later run first
# (atexit runs newest first), so they still run when the exit ends the process as a signal would.
atexit.register(_close_at_exit)

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
