"""A wall-time budget for a command that runs the user's code (`trainguard prove`, `replay`).

The user's factory and `loss_fn` can hang (a data loader that waits, a lock, a loop that never
ends) and cannot be stopped from outside. `Deadline.run` runs the command's work in a daemon
worker thread and waits for it at most the budget: when the budget ends first, the command ends
with one line naming what was running (`BudgetExceeded`, exit 2) and the worker is left behind,
to end with the process. The main thread only waits, so Ctrl-C and SIGTERM end the command as
before. Without a budget the work runs in the calling thread, as it always did.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from trainguard.errors import UsageError

T = TypeVar("T")


class BudgetExceeded(UsageError):
    """The budget ended while the command's work was still running."""


class Deadline:
    """The budget of one command; `doing` says what its work is running now."""

    def __init__(self, budget_s: float | None, lost: str = "nothing was proven") -> None:
        if budget_s is not None and not budget_s > 0:  # NaN included
            raise UsageError(f"--budget must be a positive number of seconds, got {budget_s}")
        self.budget_s = None if budget_s == float("inf") else budget_s  # no limit: no worker
        self.lost = lost
        """What the message says the command did not do when the budget ends."""
        self.doing = "the factory"
        """What the work is running now, for the message when the budget ends."""
        self.started = time.monotonic()
        self.abandoned = False
        """True once a worker was left running when the budget ended."""

    def left(self) -> float | None:
        """Seconds left in the budget (None: no budget)."""
        if self.budget_s is None:
            return None
        return max(self.budget_s - (time.monotonic() - self.started), 0.0)

    def calling(self, what: str, function: Callable[..., Any]) -> Callable[..., Any]:
        """`function`, saying `what` it is while it runs."""

        def call(*args: Any, **kwargs: Any) -> Any:
            before, self.doing = self.doing, what
            try:
                return function(*args, **kwargs)
            finally:
                self.doing = before

        return call

    def run(self, work: Callable[[], T]) -> T:
        """`work()`, or `BudgetExceeded` when the budget ends first."""
        left = self.left()
        if left is None:
            return work()
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def worker() -> None:
            try:
                outcome["value"] = work()
            except BaseException as exc:  # handed to the waiting thread, raised there
                outcome["error"] = exc
            finally:
                done.set()

        threading.Thread(target=worker, name="trainguard-budget", daemon=True).start()
        if not _wait(done, left):
            self.abandoned = True
            raise BudgetExceeded(
                f"the budget of {self.budget_s:g} s ended while {self.doing} was still running; "
                f"{self.lost} (give a larger --budget, or make it return)")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]


WAKE_S = 0.1
"""The waiting thread wakes this often: a signal the system handed to the worker thread is only
acted on when the main thread runs, so Ctrl-C and SIGTERM end the command within this."""


def _wait(done: threading.Event, seconds: float) -> bool:
    """`done.wait(seconds)` in slices of `WAKE_S`, so that signal handlers run while it waits."""
    end = time.monotonic() + seconds
    while not done.is_set():
        left = end - time.monotonic()
        if left <= 0:
            return False
        done.wait(min(WAKE_S, left))
    return True
