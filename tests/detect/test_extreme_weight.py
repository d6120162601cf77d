from __future__ import annotations

import numpy as np
import pytest

from tests.detect.synth import (
    HEALTHY_STEPS,
    INF,
    NAN,
    SEEDS,
    default_config,
    healthy_sampled_run,
    healthy_weight_stats,
    restored,
    run,
    sampled_step,
    signals,
    steps_of,
)
from trainguard.detect import ExtremeWeight
from trainguard.signals import SampledStats

NAMES = ["embed.weight", "block.0.weight", "block.1.weight", "head.weight"]


def weights_with(maxabs: list[float]) -> dict[str, np.ndarray]:
    stats = healthy_weight_stats(2, len(maxabs))
    stats["weight_maxabs"] = np.array(maxabs)
    return stats


def test_fires_above_the_limit_naming_the_worst_parameter() -> None:
    step = sampled_step(201, per_param=weights_with([0.5, 2e6, 0.3, 7e7]), names=NAMES)
    event, = ExtremeWeight(default_config()).check(step)
    assert (event.kind, event.step, event.severity) == ("extreme_weight", 200, "error")
    assert event.param == "head.weight"  # the worst, not the first
    assert event.value == pytest.approx(7e7)
    assert event.details["params"] == ["block.0.weight", "head.weight"]


def test_infinite_weight_is_extreme_and_worst() -> None:
    step = sampled_step(1, per_param=weights_with([2e6, INF, NAN, 0.1]), names=NAMES)
    event, = ExtremeWeight(default_config()).check(step)
    assert event.param == "block.0.weight"
    assert event.value == INF
    assert event.details["params"] == ["embed.weight", "block.0.weight"]  # NaN is not "extreme"


@pytest.mark.parametrize("maxabs", [1e6, 999_999.0, 0.0])
def test_silent_at_or_below_the_limit(maxabs: float) -> None:
    step = sampled_step(1, per_param=weights_with([maxabs, 1.0, 1.0, 1.0]), names=NAMES)
    assert ExtremeWeight(default_config()).check(step) == []


def test_limit_is_configurable() -> None:
    step = sampled_step(1, per_param=weights_with([0.5, 150.0, 0.3, 0.2]), names=NAMES)
    assert ExtremeWeight(default_config()).check(step) == []
    event, = ExtremeWeight(default_config(extreme_weight={"abs_limit": 100.0})).check(step)
    assert event.param == "block.0.weight"


def test_all_nan_maxabs_does_not_crash_or_fire() -> None:
    step = sampled_step(1, per_param=weights_with([NAN] * 4), names=NAMES, loss=NAN,
                        grad_norm=NAN)
    assert ExtremeWeight(default_config()).check(step) == []


def test_one_event_per_extreme_sample() -> None:
    normal = SampledStats(step=49, per_param=weights_with([1.0] * 4))
    extreme = SampledStats(step=50, per_param=weights_with([1.0, 1.0, 3e6, 1.0]))
    events = ExtremeWeight(default_config()).check(
        signals(51, names=NAMES, sampled=[normal, extreme]))
    assert steps_of(events) == [50]
    assert events[0].param == "block.1.weight"


def test_silent_without_samples() -> None:
    assert ExtremeWeight(default_config()).check(signals(0, loss=NAN, grad_norm=INF)) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_silent_on_a_healthy_run(seed: int) -> None:
    detector = ExtremeWeight(default_config())
    assert run(detector, healthy_sampled_run(HEALTHY_STEPS, seed)) == []


def test_state_round_trip_preserves_behaviour() -> None:
    original = ExtremeWeight(default_config())
    run(original, [sampled_step(1, per_param=weights_with([2e6, 0, 0, 0]), names=NAMES)])
    clone = restored(original)
    continuation = [sampled_step(i, per_param=weights_with([1, 1, 1, 1e9 if i == 31 else 1.0]),
                                 names=NAMES) for i in (11, 21, 31)]
    assert steps_of(run(clone, continuation)) == steps_of(run(original, continuation)) == [30]
