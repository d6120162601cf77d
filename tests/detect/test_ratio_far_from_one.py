"""`ratio_far_from_one` on synthetic ratio series: 1 is the ratio's own reference."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.detect.synth import default_config, signals
from trainguard.detect.ratio_far_from_one import RatioFarFromOne


def _run(values: list[float | None], name: str = "val/ratio") -> list[Any]:
    detector = RatioFarFromOne(default_config())
    return [e for i, v in enumerate(values)
            for e in detector.check(signals(i, trainer_metrics={} if v is None else {name: v}))]


def test_a_ratio_near_one_is_quiet_however_noisy() -> None:
    noisy = [1.0 + 0.3 * math.sin(i) for i in range(200)]  # 0.7 to 1.3
    assert _run(noisy) == []
    assert _run([1.0, 1.9, 1.0, 0.55, 1.0, 2.5, 1.0] * 10) == []  # single odd batches


@pytest.mark.parametrize("name", ["val/ratio", "ppo/val/ratio",
                                  "sampling/importance_sampling_ratio/mean"])
def test_a_ratio_that_stays_far_above_one_is_told_once(name: str) -> None:
    found = _run([1.0] * 10 + [12.26] * 8, name)
    assert [(e.step, e.param) for e in found] == [(11, name)]
    assert "far above 1" in found[0].message


def test_far_below_one_counts_too_and_steps_without_a_ratio_do_not() -> None:
    assert [e.step for e in _run([1.0, 0.3, None, 0.2, 1.0])] == [3]
    assert [e.step for e in _run([0.4, 1.0, 0.4, 1.0, 0.4])] == []


def test_non_finite_ratios_are_left_to_nonfinite_metric() -> None:
    assert _run([math.nan, math.inf, math.inf, 0.0]) == []


def test_the_streak_survives_a_checkpoint() -> None:
    detector = RatioFarFromOne(default_config())
    detector.check(signals(0, trainer_metrics={"val/ratio": 5.0}))
    restored = RatioFarFromOne(default_config())
    restored.load_state_dict(detector.state_dict())
    assert [e.step for e in restored.check(signals(1, trainer_metrics={"val/ratio": 5.0}))] \
        == [1]
