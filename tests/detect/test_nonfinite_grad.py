from __future__ import annotations

import pytest

from tests.detect.synth import (
    HEALTHY_STEPS,
    INF,
    NAN,
    SEEDS,
    default_config,
    healthy_grad_norms,
    norm_run,
    restored,
    run,
    signals,
    steps_of,
)
from trainguard.detect import NonFiniteGrad

NAMES = ["embed.weight", "block.0.attn.weight", "block.0.mlp.weight", "block.1.attn.weight",
         "block.1.mlp.weight", "block.2.attn.weight", "block.2.mlp.weight", "head.weight"]


def test_names_the_first_offending_parameter() -> None:
    norms = [0.1, 0.2, NAN, 0.3, INF, NAN, 0.1, 0.2]
    event, = NonFiniteGrad(default_config()).check(
        signals(7, loss=2.0, grad_norm=NAN, param_grad_norm=norms, names=NAMES))
    assert (event.kind, event.step, event.severity) == ("nonfinite_grad", 7, "error")
    assert event.param == "block.0.mlp.weight"
    assert event.details["params"] == ["block.0.mlp.weight", "block.1.mlp.weight",
                                       "block.2.attn.weight"]
    assert "NaN" in event.message and "block.0.mlp.weight" in event.message


def test_reports_inf_when_the_first_offender_is_inf() -> None:
    norms = [0.1, INF, NAN, 0.3, 0.1, 0.1, 0.1, 0.1]
    event, = NonFiniteGrad(default_config()).check(
        signals(0, grad_norm=INF, param_grad_norm=norms, names=NAMES))
    assert event.param == "block.0.attn.weight"
    assert "inf gradient" in event.message


def test_long_lists_are_truncated_in_the_message() -> None:
    config = default_config(common={"max_named_params": 2})
    event, = NonFiniteGrad(config).check(
        signals(0, grad_norm=NAN, param_grad_norm=[NAN] * 8, names=NAMES))
    assert event.details["params"] == NAMES
    assert "and 6 more" in event.message
    assert "block.1.attn.weight" not in event.message


def test_global_norm_overflow_with_finite_parts() -> None:
    event, = NonFiniteGrad(default_config()).check(
        signals(3, grad_norm=INF, param_grad_norm=[3e38, 3e38]))
    assert event.param is None
    assert event.value == INF
    assert event.details["params"] == []


def test_silent_on_gradscaler_overflow_with_finite_loss() -> None:
    detector = NonFiniteGrad(default_config())
    events = detector.check(signals(0, loss=2.0, grad_norm=INF, param_grad_norm=[INF, 1.0],
                                    amp_overflow=True, loss_scale=65536.0))
    assert events == []
    # the same gradients without a scaler are reported
    assert len(detector.check(signals(1, loss=2.0, grad_norm=INF,
                                      param_grad_norm=[INF, 1.0]))) == 1


def test_fires_when_the_loss_is_nonfinite_too() -> None:
    event, = NonFiniteGrad(default_config()).check(signals(5, loss=NAN, grad_norm=NAN))
    assert event.step == 5
    assert event.param == "a.weight"


@pytest.mark.parametrize("seed", SEEDS)
def test_silent_on_a_healthy_run(seed: int) -> None:
    detector = NonFiniteGrad(default_config())
    assert run(detector, norm_run(healthy_grad_norms(HEALTHY_STEPS, seed))) == []


def test_each_nonfinite_step_is_reported() -> None:
    detector = NonFiniteGrad(default_config())
    assert steps_of(run(detector, norm_run([1.0, NAN, INF, 1.0, 0.0, NAN]))) == [1, 2, 5]


def test_state_round_trip_preserves_behaviour() -> None:
    original = NonFiniteGrad(default_config())
    run(original, norm_run([1.0, NAN, 1.0]))
    clone = restored(original)
    continuation = norm_run([1.0, INF, 1.0, NAN], start=3)
    assert steps_of(run(clone, continuation)) == steps_of(run(original, continuation)) == [4, 6]
