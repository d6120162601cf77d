"""`no_gradients`: a forgotten backward, a detached loss or a frozen model is reported within a few
steps, with a message that tells which; a real run with gradients never is."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from trainguard import Guard, GuardConfig
from trainguard.config import DetectorConfig
from trainguard.detect.no_gradients import NoGradients
from trainguard.signals import StepSignals

QUIET = {"sinks": {"console": False}, "probes": {"preflight": False}}


def signals(step: int, grad_norm: float, loss: float | None = 1.0,
            requires_grad: bool | None = True) -> StepSignals:
    return StepSignals(step=step, loss=loss, grad_norm=grad_norm,
                       param_grad_norm=np.full(2, grad_norm), param_names=["a", "b"],
                       loss_requires_grad=requires_grad)


def test_three_empty_steps_in_a_row_fire_once_per_episode() -> None:
    detector = NoGradients(DetectorConfig())
    with_grads = {6, *range(20, 25)}  # one step with gradients does not re-arm; five do
    fired = [step for step in range(30)
             if detector.check(signals(step, 0.5 if step in with_grads else 0.0))]
    assert fired == [2, 27]


def test_nan_and_missing_losses_are_not_empty_steps() -> None:
    detector = NoGradients(DetectorConfig())
    for step in range(5):
        assert detector.check(signals(step, math.nan)) == []
        assert detector.check(signals(step, 0.0, loss=None)) == []
        assert detector.check(signals(step, 0.0, loss=math.inf)) == []


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_a_forgotten_backward_is_reported_within_three_steps() -> None:
    model, optimizer = _model()
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET))
    events = []
    for _ in range(3):
        loss = model(torch.randn(8, 4)).square().mean()  # no loss.backward()
        events += guard.step(loss).events
        optimizer.zero_grad(set_to_none=True)
    assert [(e.kind, e.severity, e.step) for e in events] == [
        ("no_gradients", "info", 0), ("no_gradients", "warning", 2)]
    assert "loss.backward()" in events[1].message
    assert guard.diagnose()[0].code == "no_gradients"
    guard.close()


@pytest.mark.parametrize("set_to_none", [True, False])
def test_one_step_backward_did_not_reach_is_told_as_info(set_to_none: bool) -> None:
    """One forgotten backward() in a healthy run: an `info` at that step, when no parameter has
    a gradient tensor; gradients of zeros (`zero_grad(set_to_none=False)`) may be a blocked
    path as well, and say nothing alone."""
    model, optimizer = _model()
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET))
    said = []
    for step in range(12):
        loss = model(torch.randn(8, 4)).square().mean()
        if step != 6:
            loss.backward()
        said += [(e.kind, e.severity, e.step) for e in guard.step(loss).events]
        optimizer.zero_grad(set_to_none=set_to_none)
    assert said == ([("no_gradients", "info", 6)] if set_to_none else [])
    guard.close()


def test_a_detached_loss_says_so() -> None:
    model, optimizer = _model()
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET))
    events = []
    for _ in range(4):
        with torch.no_grad():
            loss = model(torch.randn(8, 4)).square().mean()
        events += guard.step(loss).events
    assert [e.kind for e in events] == ["no_gradients"]
    assert "does not require grad" in events[0].message
    guard.close()


def test_a_model_frozen_mid_run_is_reported() -> None:
    model, optimizer = _model()
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET))
    kinds = []
    for step in range(8):
        if step == 3:
            for p in model.parameters():
                p.requires_grad_(False)
        x = torch.randn(8, 4)
        loss = model(x).square().mean() + x.new_zeros((), requires_grad=True)
        loss.backward()
        kinds += [(e.kind, e.severity, e.step) for e in guard.step(loss).events]
        optimizer.zero_grad(set_to_none=True)
    assert kinds == [("no_gradients", "info", 3), ("no_gradients", "warning", 5)]
    guard.close()


def test_a_healthy_run_never_fires() -> None:
    model, optimizer = _model()
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET))
    for _ in range(30):
        loss = model(torch.randn(8, 4)).square().mean()
        loss.backward()
        assert guard.step(loss).events == []
        optimizer.zero_grad(set_to_none=True)
    guard.close()


def test_a_loss_of_exactly_zero_has_no_gradients_by_right() -> None:
    """A cross-entropy saturated on data the model fits perfectly: loss 0, gradients 0."""
    detector = NoGradients(DetectorConfig())
    fired = []
    for step in range(10):
        fired += detector.check(StepSignals(step=step, loss=0.0, grad_norm=0.0,
                                            param_grad_norm=np.zeros(2), param_names=["a", "b"]))
    assert fired == []
