"""Acting before the spike: an `instability_precursor` warning halves the LR of its step under
`protect` and `recover`, the factor goes back to 1 over the brake's window, and `observe` only
warns. The warning is provoked for real: from `GROW_FROM` the loss is multiplied by a factor
that grows 30% a step for `GROW_STEPS` steps, so the gradients outgrow Adam's second moment."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch
from torch import nn

from trainguard import DetectorConfig, Guard, GuardConfig
from trainguard.recovery.brake import BRAKE_FACTOR, BRAKE_STEPS, PrecursorBrake

from ..conftest import Actions

LR = 1e-3
GROW_FROM = 50
GROW_STEPS = 8
STEPS = GROW_FROM + GROW_STEPS + BRAKE_STEPS + 10


def scale_at(step: int) -> float:
    if GROW_FROM <= step < GROW_FROM + GROW_STEPS:
        return 1.3 ** (step - GROW_FROM + 1)
    return 1.0


def train(policy: str, grow: bool = True) -> tuple[Guard, Actions, list[float]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    sink = Actions()
    guard = Guard(model, optimizer, scheduler=scheduler, sinks=[sink],
                  config=GuardConfig(policy=policy, console=False,
                                     detectors=DetectorConfig(precursor_probe=True)))
    data = torch.Generator().manual_seed(1)
    lrs = []
    for step in range(STEPS):
        x = torch.randn(32, 8, generator=data)
        loss = (model(x).squeeze(1) - x.sum(1)).square().mean()
        (loss * (scale_at(step) if grow else 1.0)).backward()
        guard.step(loss)
        lrs.append(optimizer.param_groups[0]["lr"])  # after the step: the next step's LR
        optimizer.zero_grad()
    guard.close()
    return guard, sink, lrs


def precursor_steps(guard: Guard) -> list[int]:
    return [e.step for e in guard.events if e.kind == "instability_precursor"]


@pytest.mark.parametrize("policy", ["protect", "recover"])
def test_the_warning_halves_the_lr_of_its_step_and_the_brake_is_released(policy: str) -> None:
    guard, sink, lrs = train(policy)
    warned = precursor_steps(guard)
    assert warned and GROW_FROM <= warned[0] < GROW_FROM + GROW_STEPS
    brakes = [a for a in sink.actions if a.kind == "lr_change"]
    assert [a.step for a in brakes] == [warned[0]]
    assert brakes[0].details["factor"] == BRAKE_FACTOR
    # one step of the release done when the warned step is over; none before it
    released = BRAKE_FACTOR + (1 - BRAKE_FACTOR) / BRAKE_STEPS
    assert lrs[warned[0]] == pytest.approx(released * LR)
    assert lrs[warned[0] - 1] == pytest.approx(LR)
    brake = guard.run.state.brake
    assert brake is not None and brake.pulled == [warned[0]] and not brake.active
    assert guard.optimizer.param_groups[0]["lr"] == pytest.approx(LR)  # released


def test_the_lr_ramps_back_over_the_window() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    brake = PrecursorBrake(optimizer, scheduler)
    assert brake.pull(7) and not brake.pull(8)
    seen = [optimizer.param_groups[0]["lr"]]
    for _ in range(BRAKE_STEPS):
        optimizer.step()
        scheduler.step()  # LambdaLR recomputes from its bases, which carry the factor
        brake.after_schedule()
        seen.append(optimizer.param_groups[0]["lr"])
    assert seen[0] == pytest.approx(BRAKE_FACTOR * LR)
    assert all(a < b for a, b in pairwise(seen))
    assert seen[-1] == pytest.approx(LR) and not brake.active
    assert brake.pull(30)  # released: a new warning pulls it again


def test_observe_only_warns() -> None:
    guard, sink, lrs = train("observe")
    assert precursor_steps(guard) and lrs == [LR] * STEPS
    assert not [a for a in sink.actions if a.kind == "lr_change"]
    assert guard.run.state.brake is None


def test_no_brake_without_a_warning() -> None:
    guard, sink, lrs = train("protect", grow=False)
    assert precursor_steps(guard) == []
    assert not [a for a in sink.actions if a.kind == "lr_change"] and lrs == [LR] * STEPS
