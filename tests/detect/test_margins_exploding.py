"""`margins_exploding` on synthetic margin series, against the level the DPO loss saturates at."""

from __future__ import annotations

import math

import pytest

from tests.detect.synth import default_config, signals
from trainguard.detect.margins_exploding import MarginsExploding


def _steps(series: list[float]) -> list[int]:
    detector = MarginsExploding(default_config())
    return [e.step for i, value in enumerate(series)
            for e in detector.check(signals(i, trainer_metrics={"rewards/margins": value,
                                                                "rewards/accuracies": 1.0}))]


@pytest.mark.parametrize(("series", "expected"), [
    # a run that learns its pairs: the margin settles at a few units
    ([0.0, 0.78, 1.25, 1.85, 2.5, 3.1, 3.5, 3.69, 3.69], []),
    # the LR far too high: the margin to 15, told once
    ([0.0, 0.93, 4.2, 9.58, 13.4, 14.6, 15.0, 14.5, 15.1], [4]),
    # a margin that comes back down for good and explodes again is a second episode
    ([0.0, 12.0] + [3.0] * 5 + [12.0], [1, 7]),
    # a NaN margin is left to nonfinite_metric
    ([0.0, math.nan, 11.0], [2]),
])
def test_margin_series(series: list[float], expected: list[int]) -> None:
    assert _steps(series) == expected


def test_the_event_says_what_the_run_shows() -> None:
    detector = MarginsExploding(default_config())
    [event] = detector.check(signals(3, trainer_metrics={
        "rewards/margins": 15.1, "rewards/rejected": -18.5, "rewards/accuracies": 1.0}))
    assert "15.1" in event.message and "-18.5" in event.message
    assert "accuracy at 1" in event.message
