"""The courier: a step only queues a tracker's call; a slow tracker holds nothing up, a full
queue drops and counts, a raising one is one warning and then nothing."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from trainguard.sinks.courier import Courier


def test_a_slow_tracker_never_holds_up_the_caller() -> None:
    release = threading.Event()
    made: list[int] = []

    def slow(i: int) -> None:
        release.wait(5)
        made.append(i)

    courier = Courier("SlowSink")
    start = time.perf_counter()
    for i in range(50):
        courier.send(slow, i)
    queued_in = time.perf_counter() - start
    assert queued_in < 0.5, f"queuing 50 calls took {queued_in:.3f} s"
    assert made == []
    release.set()
    assert courier.drain(5)
    assert made == list(range(50))  # in order, none lost


def test_a_full_queue_drops_and_counts_with_one_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    courier = Courier("BehindSink", capacity=2)
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        for _ in range(10):
            courier.send(release.wait, 5)
    assert 7 <= courier.dropped <= 8  # one may already be taken off the queue by the thread
    release.set()
    assert courier.drain(5)
    assert [r.getMessage() for r in caplog.records].count(
        "trainguard: BehindSink cannot keep up with the run; what it cannot take is dropped "
        "and counted, training goes on") == 1


def test_a_raising_tracker_is_one_warning_and_then_left_alone(
        caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def broken(i: int) -> None:
        calls.append(i)
        raise ConnectionError("tracker offline")

    courier = Courier("BrokenSink")
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        for i in range(5):
            courier.send(broken, i)
        assert courier.drain(5)
        assert courier.now(broken, 99) is None
        courier.send(broken, 100)
    assert calls == [0]
    assert courier.failed == "ConnectionError: tracker offline"
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
