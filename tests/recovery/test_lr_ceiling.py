"""A learning rate that stays too high: every rollback lowers the ceiling, none repeats the last.

The loop multiplies the LR by a large factor at step 60 and never puts it back: once in the
optimizer, by writing its own LR into the optimizer every step, or through a scheduler. Rolling
back and ramping back to that LR would replay the same failure; the ceiling sits below the LR in
force when the trouble began, and each relapse lowers it again. The damaging update is the one
just before the spike and every update after it is skipped, which is the case where the ceiling
used not to be lowered at all.
"""

from __future__ import annotations

import functools
import itertools
import math
import tempfile
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import trainguard
from trainguard import ConfigError, Guard, GuardConfig, RecoveryConfig, TrainingDiverged

BASE_LR = 1e-2
JUMP_AT = 60
STEPS = 300


pytestmark = pytest.mark.usefixtures("quiet_log")


@dataclass
class Result:
    guard: Guard
    rollbacks: list[trainguard.Event]
    losses: list[float]
    outcome: str

    @property
    def final_loss(self) -> float:
        return sum(self.losses[-20:]) / 20

    @property
    def lr(self) -> float:
        return float(self.guard.optimizer.param_groups[0]["lr"])


@functools.cache
def train(how: str, multiplier: float, max_rollbacks: int = 3, spike_steps: int = 0) -> Result:
    """An MLP regression trained with SGD + momentum; `how` the LR goes bad at step 60: `once`
    (multiplied in the optimizer and left), `written` (the loop writes its own LR every step),
    `scheduler` (a LambdaLR whose factor jumps and stays, or comes back after `spike_steps`)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR, momentum=0.9)
    scheduler = None
    if how == "scheduler":
        end = JUMP_AT + spike_steps if spike_steps else math.inf
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: multiplier if JUMP_AT <= s < end else 1.0)
    # a fixed cadence, so that the rollback targets do not depend on this machine's timings
    config = GuardConfig(policy="recover", recovery=RecoveryConfig(ring_every=20, ring_budget=None,
                                                 max_rollbacks=max_rollbacks),
                                                 sinks={"console": False},
                                                 checkpoints={"snapshot_dir": tempfile.mkdtemp()})
    guard = Guard(model, optimizer, scheduler, config=config)
    target = torch.randn(16, 1)
    data = torch.Generator().manual_seed(1)
    losses: list[float] = []
    outcome = "finished"
    try:
        for step in range(STEPS):
            if how == "once" and step == JUMP_AT:
                for group in optimizer.param_groups:
                    group["lr"] *= multiplier
            if how == "written":
                for group in optimizer.param_groups:
                    group["lr"] = BASE_LR * (multiplier if step >= JUMP_AT else 1.0)
            x = torch.randn(64, 16, generator=data)
            loss = nn.functional.mse_loss(model(x), x @ target)
            loss.backward()
            report = guard.step(loss)
            losses.append(math.nan if report.loss is None else report.loss)
            optimizer.zero_grad(set_to_none=True)
    except TrainingDiverged:
        outcome = "halted"
    guard.close()
    rollbacks = [e for e in guard.events if e.kind == "rollback"]
    return Result(guard, rollbacks, losses, outcome)


def _check_ceilings(rollbacks: list[trainguard.Event]) -> None:
    for event in rollbacks:  # below the LR in force when the trouble began
        assert event.details["lr_ceiling"] < event.details["lr_in_trouble"]
    ceilings = [e.details["lr_ceiling"] for e in rollbacks]
    assert all(b < a for a, b in itertools.pairwise(ceilings)), ceilings
    pairs = [(e.details["to_step"], e.details["lr_ceiling"]) for e in rollbacks]
    assert all(a != b for a, b in itertools.pairwise(pairs)), pairs


@pytest.mark.parametrize("how", ["once", "written", "scheduler"])
def test_a_permanently_bad_lr_lowers_its_ceiling_at_each_relapse(how: str) -> None:
    healthy = train("once", 1.0)
    assert healthy.outcome == "finished" and not healthy.rollbacks
    result = train(how, 1e5)
    assert len(result.rollbacks) >= 2  # it relapsed
    # the case that used to replay: every update since the spike was kept out
    assert any("has not come back" in e.details["reason"] for e in result.rollbacks)
    _check_ceilings(result.rollbacks)
    if result.outcome == "halted":
        assert len(result.rollbacks) == result.guard.config.recovery.max_rollbacks
        assert result.guard.diagnose()[0].code == "lr_too_high"
    else:
        assert result.final_loss < 1.25 * healthy.final_loss
    assert result.lr <= result.rollbacks[-1].details["lr_ceiling"] * (1 + 1e-9)


@pytest.mark.parametrize("how", ["once", "written", "scheduler"])
@pytest.mark.parametrize("multiplier", [1e3, 1e4, 1e5])
def test_consecutive_rollbacks_never_restore_the_same_step_under_the_same_ceiling(
        how: str, multiplier: float) -> None:
    result = train(how, multiplier)
    assert result.rollbacks
    _check_ceilings(result.rollbacks)


def test_the_lr_a_loop_writes_every_step_is_held_at_the_ceiling() -> None:
    result = train("written", 1e3)
    ceiling = result.rollbacks[-1].details["lr_ceiling"]
    assert ceiling < BASE_LR * 1e3
    assert result.lr == pytest.approx(ceiling)  # the loop wrote 10.0 at every step
    assert result.lr == pytest.approx(train("once", 1e3).lr)  # as if it had set it once


def test_when_the_rollbacks_run_out_the_run_halts_and_blames_the_lr() -> None:
    result = train("written", 1e5, max_rollbacks=1)
    assert result.outcome == "halted" and len(result.rollbacks) == 1
    assert any(e.kind == "rollback_limit" for e in result.guard.events)
    assert result.guard.diagnose()[0].code == "lr_too_high"


def test_a_schedule_spike_that_passes_is_not_held_back_by_the_ceiling() -> None:
    result = train("scheduler", 1e3, spike_steps=3)
    assert result.outcome == "finished" and result.rollbacks
    ceiling = result.rollbacks[-1].details["lr_ceiling"]
    assert ceiling > BASE_LR  # below the spiked LR, above the plain schedule
    assert result.lr == pytest.approx(BASE_LR)  # ramped all the way back to the schedule


@pytest.mark.parametrize("value", [0.0, -0.5, 1.5, math.nan, True])
def test_lr_ceiling_must_be_a_share(value: float) -> None:
    with pytest.raises(ConfigError, match=r"^recovery\.lr_ceiling"):
        RecoveryConfig(lr_ceiling=value)


def test_a_tensor_lr_is_kept_under_the_ceiling_without_a_host_read() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=torch.tensor(1e-2))
    config = GuardConfig(policy="recover", recovery=RecoveryConfig(ring_every=10, confirm_steps=2,
                                                 lr_ramp_steps=20), sinks={"console": False})
    guard = Guard(model, optimizer, config=config)
    target = torch.randn(16, 1)

    def steps(count: int) -> list[trainguard.StepReport]:
        reports = []
        for _ in range(count):
            x = torch.randn(32, 16)
            loss = nn.functional.mse_loss(model(x), x @ target)
            loss.backward()
            reports.append(guard.step(loss))
            optimizer.zero_grad(set_to_none=True)
        return reports

    steps(25)
    event = guard.rollback(to_step=20)
    ceiling = event.details["lr_ceiling"]
    assert ceiling == pytest.approx(0.5e-2)
    reports = steps(40)
    assert isinstance(optimizer.param_groups[0]["lr"], torch.Tensor)
    # from the second step on, every update used an LR under the ceiling, and the ramp ends on it
    assert all(r.lr is not None and r.lr <= ceiling * (1 + 1e-6) for r in reports[1:])
    assert float(optimizer.param_groups[0]["lr"]) == pytest.approx(ceiling)
    guard.close()
