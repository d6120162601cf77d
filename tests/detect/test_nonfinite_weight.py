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
from trainguard.detect import NonFiniteWeight
from trainguard.signals import SampledStats

NAMES = ["embed.weight", "block.0.weight", "block.1.weight", "head.weight"]


def weights_with(nonfinite: list[float]) -> dict[str, np.ndarray]:
    stats = healthy_weight_stats(0, len(nonfinite))
    stats["weight_nonfinite"] = np.array(nonfinite)
    return stats


def test_fires_at_the_sampled_step_naming_the_first_parameter() -> None:
    step = sampled_step(51, per_param=weights_with([0, 12, 0, 3]), names=NAMES)
    event, = NonFiniteWeight(default_config()).check(step)
    assert (event.kind, event.severity) == ("nonfinite_weight", "error")
    assert event.step == 50  # the step the weights were measured at, not the transfer's
    assert event.param == "block.0.weight"
    assert event.value == 12
    assert event.details["params"] == ["block.0.weight", "head.weight"]


def test_one_event_per_bad_sample_in_a_transfer() -> None:
    good = SampledStats(step=49, per_param={"weight_nonfinite": np.zeros(4)})
    bad = SampledStats(step=50, per_param={"weight_nonfinite": np.array([1.0, 0, 0, 0])})
    worse = SampledStats(step=51, per_param={"weight_nonfinite": np.array([5.0, 0, 0, 2])})
    events = NonFiniteWeight(default_config()).check(
        signals(52, names=NAMES, sampled=[good, bad, worse]))
    assert steps_of(events) == [50, 51]
    assert [e.param for e in events] == ["embed.weight", "embed.weight"]
    assert events[1].details["params"] == ["embed.weight", "head.weight"]


def test_silent_without_samples_or_without_weight_stats() -> None:
    detector = NonFiniteWeight(default_config())
    assert detector.check(signals(0, loss=NAN, grad_norm=NAN)) == []
    activations_only = sampled_step(1, names=NAMES, module_names=["m"],
                                    per_module={"act_maxabs": [INF], "act_nonfinite": [1.0],
                                                "act_fp16": [1.0], "act_zero_frac": [0.0]})
    assert detector.check(activations_only) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_silent_on_a_healthy_run(seed: int) -> None:
    detector = NonFiniteWeight(default_config())
    assert run(detector, healthy_sampled_run(HEALTHY_STEPS, seed)) == []


def test_nan_elsewhere_in_the_sample_is_not_a_nonfinite_weight() -> None:
    stats = weights_with([0, 0, 0, 0])
    stats["weight_maxabs"] = np.array([NAN, INF, 1.0, 1.0])
    stats["update_ratio"] = np.array([NAN] * 4)
    assert NonFiniteWeight(default_config()).check(
        sampled_step(1, per_param=stats, names=NAMES)) == []


def test_every_bad_sample_is_reported() -> None:
    # weights stay broken until fixed; each sampled measurement that shows it is reported
    detector = NonFiniteWeight(default_config())
    steps = [sampled_step(i, per_param=weights_with([0, 0, 0, float(i in (11, 21, 41))]),
                          names=NAMES) for i in (1, 11, 21, 31, 41)]
    assert steps_of(run(detector, steps)) == [10, 20, 40]


def test_state_round_trip_preserves_behaviour() -> None:
    original = NonFiniteWeight(default_config())
    run(original, [sampled_step(1, per_param=weights_with([1, 0, 0, 0]), names=NAMES)])
    clone = restored(original)
    continuation = [sampled_step(i, per_param=weights_with([0, float(i == 31), 0, 0]),
                                 names=NAMES) for i in (11, 21, 31)]
    assert steps_of(run(clone, continuation)) == steps_of(run(original, continuation)) == [30]
