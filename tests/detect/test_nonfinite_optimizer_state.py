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
from trainguard.detect import NonFiniteOptimizerState
from trainguard.signals import SampledStats

NAMES = ["embed.weight", "block.0.weight", "block.1.weight", "head.weight"]


def state_with(**norms: list[float]) -> dict[str, np.ndarray]:
    stats = healthy_weight_stats(1, len(NAMES))
    for key, values in norms.items():
        stats[f"optstate_{key}_norm"] = np.array(values)
    return stats


def test_fires_on_poisoned_second_moment() -> None:
    step = sampled_step(101, per_param=state_with(exp_avg_sq=[1e-8, INF, 1e-8, NAN]),
                        names=NAMES)
    event, = NonFiniteOptimizerState(default_config()).check(step)
    assert (event.kind, event.step, event.severity) == ("nonfinite_optimizer_state", 100, "error")
    assert event.param == "block.0.weight"
    assert event.details["params"] == ["block.0.weight", "head.weight"]
    assert event.details["state_keys"] == ["exp_avg_sq"]


def test_names_every_poisoned_key_and_parameter_in_order() -> None:
    step = sampled_step(11, per_param=state_with(exp_avg=[0.1, 0.1, 0.1, NAN],
                                                 exp_avg_sq=[NAN, 1e-8, 1e-8, 1e-8]),
                        names=NAMES)
    event, = NonFiniteOptimizerState(default_config()).check(step)
    assert event.param == "embed.weight"
    assert event.details["params"] == ["embed.weight", "head.weight"]
    assert sorted(event.details["state_keys"]) == ["exp_avg", "exp_avg_sq"]


def test_ignores_maxabs_and_other_keys() -> None:
    stats = state_with()
    stats["optstate_exp_avg_maxabs"] = np.array([NAN] * 4)  # the norm keys decide
    stats["weight_maxabs"] = np.array([INF] * 4)
    stats["update_ratio"] = np.array([NAN] * 4)
    assert NonFiniteOptimizerState(default_config()).check(
        sampled_step(1, per_param=stats, names=NAMES)) == []


def test_one_event_per_poisoned_sample() -> None:
    clean = SampledStats(step=9, per_param=state_with())
    poisoned = SampledStats(step=10, per_param=state_with(exp_avg=[0.1, NAN, 0.1, 0.1]))
    events = NonFiniteOptimizerState(default_config()).check(
        signals(11, names=NAMES, sampled=[clean, poisoned]))
    assert steps_of(events) == [10]
    assert events[0].param == "block.0.weight"


def test_silent_without_samples() -> None:
    assert NonFiniteOptimizerState(default_config()).check(
        signals(0, loss=NAN, grad_norm=NAN)) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_silent_on_a_healthy_run(seed: int) -> None:
    detector = NonFiniteOptimizerState(default_config())
    assert run(detector, healthy_sampled_run(HEALTHY_STEPS, seed)) == []


def test_parameters_without_state_are_not_reported() -> None:
    # the probe writes 0 for parameters the optimizer holds no state for (frozen, or not yet
    # stepped): that is not a poisoned moment
    stats = state_with(exp_avg=[0.0, 0.0, 0.1, 0.1], exp_avg_sq=[0.0, 0.0, 1e-8, 1e-8])
    assert NonFiniteOptimizerState(default_config()).check(
        sampled_step(1, per_param=stats, names=NAMES)) == []


def test_state_round_trip_preserves_behaviour() -> None:
    original = NonFiniteOptimizerState(default_config())
    run(original, [sampled_step(1, per_param=state_with(exp_avg=[NAN, 0, 0, 0]), names=NAMES)])
    clone = restored(original)
    continuation = [sampled_step(i, per_param=state_with(exp_avg_sq=[0, 0, INF if i == 21 else 0,
                                                                      0]),
                                 names=NAMES) for i in (11, 21, 31)]
    assert steps_of(run(clone, continuation)) == steps_of(run(original, continuation)) == [20]
