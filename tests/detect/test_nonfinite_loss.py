from __future__ import annotations

import math

import pytest

from tests.detect.synth import (
    HEALTHY_STEPS,
    INF,
    NAN,
    SEEDS,
    default_config,
    healthy_losses,
    loss_run,
    restored,
    run,
    signals,
    steps_of,
)
from trainguard.detect import NonFiniteLoss


@pytest.mark.parametrize("loss", [NAN, INF, -INF])
def test_fires_on_nonfinite_loss(loss: float) -> None:
    detector = NonFiniteLoss(default_config())
    run(detector, loss_run([2.3, 2.2, 2.1]))
    events = detector.check(signals(3, loss=loss))
    assert len(events) == 1
    event = events[0]
    assert (event.kind, event.step, event.severity) == ("nonfinite_loss", 3, "error")
    assert event.param is None
    assert event.value is not None and not math.isfinite(event.value)
    assert (math.isnan(event.value) if math.isnan(loss) else event.value == loss)


@pytest.mark.parametrize("seed", SEEDS)
def test_silent_on_a_healthy_run(seed: int) -> None:
    detector = NonFiniteLoss(default_config())
    assert run(detector, loss_run(healthy_losses(HEALTHY_STEPS, seed))) == []


@pytest.mark.parametrize("loss", [None, 0.0, -3.5, 1e38, 5e-324])
def test_silent_on_finite_or_missing_loss(loss: float | None) -> None:
    assert NonFiniteLoss(default_config()).check(signals(0, loss=loss)) == []


def test_every_nonfinite_step_is_reported_and_finite_steps_are_not() -> None:
    # every step with a non-finite loss is one the policy skips: each is reported
    detector = NonFiniteLoss(default_config())
    losses = [2.0, NAN, NAN, 1.9, INF, 1.8, 1.7]
    assert steps_of(run(detector, loss_run(losses))) == [1, 2, 4]


def test_nonfinite_gradients_alone_are_not_a_loss_problem() -> None:
    detector = NonFiniteLoss(default_config())
    assert detector.check(signals(0, loss=2.0, grad_norm=NAN)) == []


def test_state_round_trip_preserves_behaviour() -> None:
    original = NonFiniteLoss(default_config())
    run(original, loss_run([2.0, NAN, 1.9]))
    clone = restored(original)
    continuation = loss_run([1.8, NAN, 1.7, INF], start=3)
    assert steps_of(run(clone, continuation)) == steps_of(run(original, continuation)) == [4, 6]
