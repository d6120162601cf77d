"""LR backoff: a linear ramp on top of the schedule, for closed-form and chainable schedulers."""

from __future__ import annotations

import pytest
import torch

from trainguard.recovery.lr import LRBackoff


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
    backoff = LRBackoff([opt], ramp_steps=4)
    backoff.begin(0.1, 1.0, [opt.param_groups[0]["lr"]])
    seen = [opt.param_groups[0]["lr"] / plain_opt.param_groups[0]["lr"]]
    for _ in range(8):
        plain_opt.step()  # no gradients: only keeps the schedulers' call-order check quiet
        opt.step()
        plain.step()
        backoff.around_scheduler_step(sched)
        seen.append(opt.param_groups[0]["lr"] / plain_opt.param_groups[0]["lr"])
    assert seen[:5] == pytest.approx([0.1, 0.325, 0.55, 0.775, 1.0])
    assert seen[5:] == pytest.approx([1.0] * 4)
    assert not backoff.active  # fully ramped back: no more work per step
    assert opt.param_groups[0]["lr"] == plain_opt.param_groups[0]["lr"]


def test_a_lowered_ceiling_stays_and_survives_a_state_round_trip() -> None:
    opt = _optimizer(0.5)
    backoff = LRBackoff([opt], ramp_steps=2)
    backoff.begin(0.01, 0.1, [0.5])
    for _ in range(5):
        backoff.around_scheduler_step(None)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    other = LRBackoff([opt], ramp_steps=2)
    other.load_state_dict(backoff.state_dict())
    assert other.pure_lrs() == pytest.approx([0.5]) and other.factor() == pytest.approx(0.1)


def test_lr_changed_by_user_code_is_respected() -> None:
    opt = _optimizer(1.0)
    backoff = LRBackoff([opt], ramp_steps=10)
    backoff.begin(0.1, 1.0, [1.0])
    opt.param_groups[0]["lr"] = 0.02  # the user lowered the (effective) LR by hand
    assert backoff.pure_lrs() == pytest.approx([0.2])
