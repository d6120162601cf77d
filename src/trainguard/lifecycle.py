"""Runs that end with their process: none stays "running" forever.

A run whose process ends without `guard.close()` (a script that forgot it, Ctrl-C, SIGTERM from
a scheduler) is closed with the status "interrupted":

- at interpreter exit (`atexit`), which also covers Ctrl-C: the KeyboardInterrupt ends the
  process through the normal exit path;
- on SIGTERM, only if the handler in place when a run is tracked is the default one and the run
  is tracked from the main thread: trainguard then installs a handler that closes every tracked
  run, restores the default handler and sends SIGTERM again, so the process still ends as killed
  by SIGTERM. Handlers installed by the user or a framework are left alone.

SIGKILL cannot be caught: such a run stays "running", and the store still holds every step but
at most the last one.

    handle = lifecycle.track(close)   # close(status) ends and closes the run
    ...
    lifecycle.untrack(handle)         # after a normal close

Closers run at most once each, newest first; one that raises is logged and the others still run.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("trainguard")

INTERRUPTED = "interrupted"
SIGNAL_CLOSE_TIMEOUT = 20.0
"""Seconds the SIGTERM handler waits for the runs to close before the process ends anyway."""


class RunHandle:
    """A tracked run: its closer and the process that tracked it."""

    __slots__ = ("close", "pid")

    def __init__(self, close: Callable[[str], None]) -> None:
        self.close = close
        self.pid = os.getpid()

    def __repr__(self) -> str:
        return f"RunHandle({self.close!r}, pid={self.pid})"


_lock = threading.RLock()
_tracked: list[RunHandle] = []
_atexit_registered = False


def track(close: Callable[[str], None]) -> RunHandle:
    """Close this run with `close("interrupted")` if the process ends before `untrack`."""
    global _atexit_registered
    handle = RunHandle(close)
    with _lock:
        _tracked.append(handle)
        if not _atexit_registered:
            atexit.register(_close_at_exit)
            _atexit_registered = True
    _install_sigterm_handler()
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


def close_all(status: str = INTERRUPTED) -> int:
    """Close every tracked run of this process with `status`, newest first; returns how many
    closers ran. Each is called once, and a failing one does not stop the others."""
    with _lock:
        pid = os.getpid()
        handles = [h for h in reversed(_tracked) if h.pid == pid]
        _tracked[:] = [h for h in _tracked if h.pid != pid]
    for handle in handles:
        try:
            handle.close(status)
        except Exception as exc:  # one broken closer must not keep the others open
            log.error("trainguard: closing a run at exit failed (%s: %s)", type(exc).__name__,
                      exc)
    return len(handles)


def _close_at_exit() -> None:
    close_all(INTERRUPTED)


def _install_sigterm_handler() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # an interpreter without signals
        pass


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # The handler interrupts the main thread wherever it is, possibly inside the store's queue
    # lock; closing from another thread with a deadline means such a run is left as it is
    # rather than the process hanging.
    closer = threading.Thread(target=close_all, args=(INTERRUPTED,),
                              name="trainguard-sigterm", daemon=True)
    closer.start()
    closer.join(SIGNAL_CLOSE_TIMEOUT)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.RLock()  # another thread may have held it at fork
    _tracked.clear()  # the parent's runs are the parent's to close


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
