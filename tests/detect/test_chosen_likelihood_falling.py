"""`chosen_likelihood_falling` on synthetic series of the chosen log-probability and margin."""

from __future__ import annotations

import math

import pytest

from tests.detect.synth import default_config, signals
from trainguard.detect.chosen_likelihood_falling import ChosenLikelihoodFalling


def _steps(logps: list[float], margins: list[float]) -> list[int]:
    detector = ChosenLikelihoodFalling(default_config())
    return [e.step for i, (value, margin) in enumerate(zip(logps, margins, strict=True))
            for e in detector.check(signals(i, trainer_metrics={"logps/chosen": value,
                                                                "rewards/margins": margin}))]


RISING_MARGIN = [0.0, 0.9, 4.2, 9.6, 13.4, 14.6, 15.0, 14.5, 15.1]


@pytest.mark.parametrize(("logps", "margins", "expected"), [
    # a run that learns raises the chosen log-probability
    ([-34.5, -30.7, -28.8, -27.2, -25.9, -24.9, -24.1, -23.5, -22.9],
     [0.0, 0.8, 1.2, 1.6, 1.8, 2.0, 2.2, 2.3, 2.4], []),
    # the margin grows while the chosen answers lose probability: from -23.8 (the median
    # of the first three) to -37.4 and on to -68, told once
    ([-34.5, -22.0, -23.8, -37.4, -50.2, -63.0, -66.1, -67.8, -68.6], RISING_MARGIN, [3]),
    # a chosen log-probability that falls a little (under half its start) is no displacement
    ([-34.5, -34.0, -34.2, -40.0, -45.0, -48.0, -49.0, -50.0, -51.0], RISING_MARGIN, []),
    # both fall with no margin (nothing separated): not this event
    ([-34.5, -34.5, -34.5, -60.0, -70.0], [0.0, 0.0, 0.0, -0.5, -1.0], []),
    # a NaN log-probability is left to nonfinite_metric and does not enter the start
    ([math.nan, -30.0, -30.0, -30.0, -50.0], [0.0, 1.0, 2.0, 3.0, 4.0], [4]),
])
def test_chosen_logps_series(logps: list[float], margins: list[float],
                             expected: list[int]) -> None:
    assert _steps(logps, margins) == expected
