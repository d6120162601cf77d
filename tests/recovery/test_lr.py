"""LR backoff: a linear ramp on top of the schedule, for closed-form and chainable schedulers."""

from __future__ import annotations

import math

import pytest
import torch

from trainguard import UsageError
from trainguard.recovery.lr import LRBackoff, scale_learning_rate

from ..conftest import advance, lambda_setup, lrs


def _optimizer(lr: float = 1.0) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


@pytest.mark.parametrize("kind", ["lambda", "step"])
def test_backoff_ramps_linearly_back_to_the_plain_schedule(kind: str) -> None:
    plain_opt, opt = _optimizer(), _optimizer()

    def make(o):
        if kind == "lambda":
            return torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.99 ** s)
        return torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5)  # chainable

    plain, sched = make(plain_opt), make(opt)
    backoff = LRBackoff([opt], [sched], ramp_steps=4)
    backoff.begin(0.1, 1.0, applied=1.0)
    seen = [opt.param_groups[0]["lr"] / plain_opt.param_groups[0]["lr"]]
    for _ in range(8):
        plain_opt.step()  # no gradients: only keeps the schedulers' call-order check quiet
        opt.step()
        plain.step()
        sched.step()  # whoever steps the scheduler (a trainer), the backoff follows after it
        backoff.step()
        seen.append(opt.param_groups[0]["lr"] / plain_opt.param_groups[0]["lr"])
    assert seen[:5] == pytest.approx([0.1, 0.325, 0.55, 0.775, 1.0])
    assert seen[5:] == pytest.approx([1.0] * 4)
    assert not backoff.active  # fully ramped back: no more work per step
    assert opt.param_groups[0]["lr"] == pytest.approx(plain_opt.param_groups[0]["lr"])


def test_a_lowered_ceiling_stays_and_survives_a_state_round_trip() -> None:
    opt = _optimizer(0.5)
    backoff = LRBackoff([opt], [], ramp_steps=2)
    backoff.begin(0.01, 0.1, applied=1.0)
    for _ in range(5):
        backoff.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    other = LRBackoff([opt], [], ramp_steps=2)
    other.load_state_dict(backoff.state_dict())
    assert other.active and other.factor() == pytest.approx(0.1)


def test_a_restored_state_that_already_carried_a_factor_is_rescaled_not_compounded() -> None:
    opt = _optimizer(0.2)  # the LR of a state taken while a 0.2 factor was on: 1.0 * 0.2
    backoff = LRBackoff([opt], [], ramp_steps=10)
    backoff.begin(0.1, 1.0, applied=0.2)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)


def test_scale_learning_rate_survives_the_next_lambda_step() -> None:
    optimizer, scheduler = lambda_setup()
    advance(optimizer, scheduler)
    scale_learning_rate(optimizer, [scheduler], 0.5)
    assert lrs(optimizer) == pytest.approx([0.5 * 0.1 / 2])
    advance(optimizer, scheduler)
    assert lrs(optimizer) == pytest.approx([0.5 * 0.1 / 3])

    unscaled_optimizer, unscaled = lambda_setup()
    advance(unscaled_optimizer, unscaled)
    unscaled_optimizer.param_groups[0]["lr"] *= 0.5  # what a naive change does
    advance(unscaled_optimizer, unscaled)
    assert lrs(unscaled_optimizer) == pytest.approx([0.1 / 3]), "LambdaLR undid the change"


@pytest.mark.parametrize("factor", [0.0, -1.0, math.nan, math.inf, True, "0.5"])
def test_scale_learning_rate_rejects_bad_factors(factor: object) -> None:
    optimizer, scheduler = lambda_setup()
    with pytest.raises(UsageError, match="factor"):
        scale_learning_rate(optimizer, [scheduler], factor)  # type: ignore[arg-type]
