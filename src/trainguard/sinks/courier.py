"""Hands a tracker's calls to one background thread, so that a slow, offline or raising tracker
never holds up or fails an optimizer step.

The training thread only queues a call (a bound method and its arguments, made from plain
values); the courier's thread makes the calls in order. The queue is bounded: when the tracker
falls that far behind, new calls are dropped and counted, never waited for. The first call that
raises stops the courier: it says why once (one warning) and drops everything after it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("trainguard")

_STOP = object()


class Courier:
    """One daemon thread that makes a tracker's calls in the order they were queued."""

    def __init__(self, name: str, *, capacity: int = 10_000) -> None:
        self.name = name
        """The sink it works for, as the warning names it."""
        self.failed: str | None = None
        """Why the tracker was given up (the first call that raised), None while it works."""
        self.dropped = 0
        """Calls dropped because the queue was full (the tracker fell behind)."""
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=capacity)
        self._thread: threading.Thread | None = None
        self._told_full = False

    def send(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Queue one call; never blocks, never raises."""
        if self.failed is not None:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=f"trainguard-{self.name}",
                                            daemon=True)
            self._thread.start()
        try:
            self._queue.put_nowait((call, args, kwargs))
        except queue.Full:  # the tracker is that far behind: training does not wait for it
            self.dropped += 1
            if not self._told_full:
                self._told_full = True
                log.warning("trainguard: %s cannot keep up with the run; what it cannot take "
                            "is dropped and counted, training goes on", self.name)

    def now(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Make a call on this thread (the run's start, its end), failures handled alike;
        None when it failed or the tracker was given up."""
        if self.failed is not None:
            return None
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            self._give_up(exc)
            return None

    def drain(self, timeout_s: float) -> bool:
        """Wait, at most `timeout_s`, for the queued calls to be made and stop the thread; False
        when the tracker did not finish in time (its calls are then left to the daemon
        thread)."""
        thread = self._thread
        if thread is None:
            return True
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            return False
        thread.join(timeout_s)
        self._thread = None if not thread.is_alive() else thread
        return not thread.is_alive()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if self.failed is not None:
                continue  # given up: empty the queue without calling
            call, args, kwargs = item
            try:
                call(*args, **kwargs)
            except Exception as exc:  # a tracker's failure must not reach training
                self._give_up(exc)

    def _give_up(self, exc: BaseException) -> None:
        if self.failed is not None:
            return
        self.failed = f"{type(exc).__name__}: {exc}"
        log.warning("trainguard: %s failed (%s) and stopped reporting; training goes on",
                    self.name, self.failed)

