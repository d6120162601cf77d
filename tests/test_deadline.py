"""`Deadline`: a command's work run within a wall-time budget, the user's code included."""

from __future__ import annotations

import threading
import time

import pytest

from trainguard.deadline import BudgetExceeded, Deadline
from trainguard.errors import UsageError


def test_without_a_budget_the_work_runs_in_the_calling_thread() -> None:
    assert Deadline(None).run(threading.get_ident) == threading.get_ident()
    assert Deadline(None).left() is None


def test_the_work_s_result_and_its_error_come_back_to_the_caller() -> None:
    deadline = Deadline(5.0)
    assert deadline.run(lambda: 42) == 42

    def fails() -> None:
        raise ValueError("the user's")

    with pytest.raises(ValueError, match="the user's"):
        deadline.run(fails)
    assert not deadline.abandoned


def test_the_end_of_the_budget_names_what_was_running() -> None:
    deadline = Deadline(0.3, "nothing was replayed")
    release = threading.Event()
    hang = deadline.calling("the factory's loss_fn", lambda: release.wait(10))
    started = time.monotonic()
    try:
        with pytest.raises(BudgetExceeded, match=r"the budget of 0\.3 s ended while the "
                                                 r"factory's loss_fn was still running; "
                                                 r"nothing was replayed"):
            deadline.run(hang)
    finally:
        release.set()
    assert time.monotonic() - started < 2 and deadline.abandoned
    assert isinstance(BudgetExceeded("x"), UsageError)  # one line, exit 2


@pytest.mark.parametrize("budget", [0.0, -1.0, float("nan")])
def test_a_budget_that_is_not_a_positive_number_is_a_usage_error(budget: float) -> None:
    with pytest.raises(UsageError, match="--budget must be a positive number of seconds"):
        Deadline(budget)
