"""`entropy_collapse` on synthetic entropy series, relative to where the run started."""

from __future__ import annotations

import math

import pytest

from tests.detect.synth import default_config, signals
from trainguard.detect.entropy_collapse import EntropyCollapse


def _steps(series: list[float]) -> list[int]:
    detector = EntropyCollapse(default_config())
    return [e.step for i, value in enumerate(series)
            for e in detector.check(signals(i, trainer_metrics={"entropy": value}))]


@pytest.mark.parametrize(("series", "expected"), [
    # learning lowers the entropy: 3.8 to 1.5 is no collapse
    ([3.83, 3.83, 3.82, 3.5, 3.0, 2.5, 2.0, 1.5], []),
    # the LR far too high: 3.8 to 0.3 within a few updates, told once
    ([3.83, 3.57, 3.63, 3.37, 2.96, 2.56, 2.06, 0.78, 0.31, 0.37, 0.28], [8]),
    # a collapse that comes back and goes again is a second episode
    ([1.0, 1.0, 1.0, 0.05] + [0.9] * 5 + [0.05], [3, 9]),
    # a NaN entropy is left to nonfinite_metric and does not enter the start
    ([math.nan, 1.0, 1.0, 1.0, 0.05], [4]),
])
def test_entropy_series(series: list[float], expected: list[int]) -> None:
    assert _steps(series) == expected
