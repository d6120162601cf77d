"""`completion_length_collapse` on synthetic mean-length series, against the run's start."""

from __future__ import annotations

import math

import pytest

from tests.detect.synth import default_config, signals
from trainguard.detect.completion_length_collapse import CompletionLengthCollapse


def _steps(series: list[float]) -> list[int]:
    detector = CompletionLengthCollapse(default_config())
    return [e.step for i, value in enumerate(series)
            for e in detector.check(signals(
                i, trainer_metrics={"completions/mean_length": value}))]


@pytest.mark.parametrize(("series", "expected"), [
    # GRPO's lengths wander +-30% batch to batch, and answers learn to be shorter: no collapse
    ([120, 95, 140, 110, 80, 150, 70, 90, 60, 75, 55, 85], []),
    # one batch of short answers is no trend
    ([120, 110, 130, 20, 115, 125], []),
    # the policy collapsing to an end of sequence straight away: told once, at the 2nd step
    ([120, 110, 130, 90, 25, 3, 1, 1, 1], [5]),
    # a collapse that comes back and goes again is a second episode
    ([100, 100, 100, 10, 10] + [100] * 5 + [5, 5], [4, 11]),
    # a NaN length is not judged and does not enter the start
    ([math.nan, 100, 100, 100, 10, 10], [5]),
])
def test_mean_length_series(series: list[float], expected: list[int]) -> None:
    assert _steps(series) == expected


def test_its_state_survives_a_resume() -> None:
    first = CompletionLengthCollapse(default_config())
    for i, value in enumerate([100, 100, 100, 10]):
        assert not first.check(signals(i, trainer_metrics={"completions/mean_length": value}))
    resumed = CompletionLengthCollapse(default_config())
    resumed.load_state_dict(first.state_dict())
    assert [e.step for e in resumed.check(
        signals(4, trainer_metrics={"completions/mean_length": 10}))] == [4]
