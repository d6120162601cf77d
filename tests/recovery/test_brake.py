"""Acting before the spike: an `instability_precursor` warning halves the LR of its step under
`protect`, `recover` and `halt` (below its `halt_severity`), the factor goes back to 1 over the
brake's window, and `observe` only warns. The warning is provoked for real: from `GROW_FROM`
the loss is multiplied by a factor that grows 30% a step for `GROW_STEPS` steps, so the
gradients outgrow Adam's second moment."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
import torch
from torch import nn

from trainguard import DetectorConfig, Guard, GuardConfig
from trainguard.recovery.brake import BRAKE_FACTOR, BRAKE_STEPS, PrecursorBrake
from trainguard.recovery.lr import LRBackoff

from ..conftest import Actions

LR = 1e-3
GROW_FROM = 50
GROW_STEPS = 8
STEPS = GROW_FROM + GROW_STEPS + BRAKE_STEPS + 10


NOISE = 5.0
"""The targets' noise: the loss levels off at it early, so the provoked rises come on a loss that
no longer falls (a rise while it still falls is a model learning, no precursor)."""
AGAIN = GROW_FROM + GROW_STEPS + BRAKE_STEPS + 15
"""Where `train(..., again=True)` grows the loss a second time, after the brake's release."""


def scale_at(step: int, again: bool = False) -> float:
    for start in (GROW_FROM, AGAIN) if again else (GROW_FROM,):
        if start <= step < start + GROW_STEPS:
            return 1.3 ** (step - start + 1)
    return 1.0


def train(policy: str, grow: bool = True, again: bool = False,
          steps: int = STEPS) -> tuple[Guard, Actions, list[float]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    sink = Actions()
    guard = Guard(model, optimizer, scheduler=scheduler, sinks=[sink],
                  config=GuardConfig(policy=policy, sinks={"console": False},
                                     detectors=DetectorConfig(
                                         instability_precursor={"probe": True})))
    data = torch.Generator().manual_seed(1)
    lrs = []
    for step in range(steps):
        x = torch.randn(32, 8, generator=data)
        target = x.sum(1) + NOISE * torch.randn(32, generator=data)
        loss = (model(x).squeeze(1) - target).square().mean()
        (loss * (scale_at(step, again) if grow else 1.0)).backward()
        guard.step(loss)
        lrs.append(optimizer.param_groups[0]["lr"])  # after the step: the next step's LR
        optimizer.zero_grad()
    guard.close()
    return guard, sink, lrs


def precursor_steps(guard: Guard) -> list[int]:
    return [e.step for e in guard.events if e.kind == "instability_precursor"]


@pytest.mark.parametrize("policy", ["protect", "recover", "halt"])
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
    assert not guard.run.halted  # under halt, a warning below `halt_severity` does not halt


def test_the_lr_ramps_back_over_the_window() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    brake = PrecursorBrake(optimizer, scheduler)
    assert brake.pull(7) == "brake"
    seen = [optimizer.param_groups[0]["lr"]]
    for _ in range(BRAKE_STEPS):
        optimizer.step()
        scheduler.step()  # LambdaLR recomputes from its bases, which carry the factor
        brake.after_schedule()
        seen.append(optimizer.param_groups[0]["lr"])
    assert seen[0] == pytest.approx(BRAKE_FACTOR * LR)
    assert all(a < b for a, b in pairwise(seen))
    assert seen[-1] == pytest.approx(LR) and not brake.active


def test_observe_only_warns() -> None:
    guard, sink, lrs = train("observe")
    assert precursor_steps(guard) and lrs == [LR] * STEPS
    assert not [a for a in sink.actions if a.kind == "lr_change"]
    assert guard.run.state.brake is None


@pytest.mark.parametrize("policy", ["protect", "recover", "halt"])
def test_a_warning_that_comes_back_holds_the_lr_under_a_ceiling(policy: str) -> None:
    steps = AGAIN + GROW_STEPS + 30
    guard, sink, lrs = train(policy, again=True, steps=steps)
    warned = precursor_steps(guard)
    assert len(warned) == 2 and AGAIN <= warned[1] < AGAIN + GROW_STEPS
    changes = [a for a in sink.actions if a.kind == "lr_change"]
    assert [a.step for a in changes] == warned
    assert changes[1].details["ceiling"] == pytest.approx(BRAKE_FACTOR * LR)
    assert lrs[warned[1] - 1] == pytest.approx(LR)  # released before it came back
    assert lrs[warned[1]:] == [pytest.approx(BRAKE_FACTOR * LR)] * (steps - warned[1])


def test_no_brake_without_a_warning() -> None:
    guard, sink, lrs = train("protect", grow=False)
    assert precursor_steps(guard) == []
    assert not [a for a in sink.actions if a.kind == "lr_change"] and lrs == [LR] * STEPS


def rising(step: int) -> float:
    """A schedule that keeps raising the LR, 3% a step."""
    return 1.03 ** step


def brake_on_rising_schedule(keeper: bool = False) -> tuple[
        PrecursorBrake, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR,
        LRBackoff | None]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, rising)
    recovery = LRBackoff([optimizer], [scheduler], 10) if keeper else None
    return PrecursorBrake(optimizer, scheduler, keeper=recovery), optimizer, scheduler, recovery


def advance(optimizer: torch.optim.Optimizer, scheduler: Any, brake: PrecursorBrake,
            steps: int, keeper: LRBackoff | None = None) -> list[float]:
    seen = []
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        brake.after_schedule()
        if keeper is not None:
            keeper.step()
        seen.append(optimizer.param_groups[0]["lr"])
    return seen


def test_a_warning_that_comes_back_after_the_release_holds_a_ceiling_for_the_rest() -> None:
    brake, optimizer, scheduler, _ = brake_on_rising_schedule()
    assert brake.pull(0) == "brake"
    advance(optimizer, scheduler, brake, BRAKE_STEPS + 5)
    assert not brake.active  # released: back on the rising schedule
    at_warning = optimizer.param_groups[0]["lr"]
    assert at_warning == pytest.approx(LR * rising(BRAKE_STEPS + 5))
    assert brake.pull(BRAKE_STEPS + 5) == "ceiling"
    ceiling = BRAKE_FACTOR * at_warning
    assert brake.ceilings == [pytest.approx(ceiling)]
    assert optimizer.param_groups[0]["lr"] == pytest.approx(ceiling)  # this step's update
    seen = advance(optimizer, scheduler, brake, 200)
    assert seen == [pytest.approx(ceiling)] * 200 and brake.active  # held, never released
    # a further warning lowers it again
    assert brake.pull(300) == "ceiling"
    assert advance(optimizer, scheduler, brake, 3) == [pytest.approx(BRAKE_FACTOR * ceiling)] * 3


def test_a_return_no_higher_than_the_one_that_set_the_ceiling_leaves_it() -> None:
    """A signal that stands where it stood when the ceiling was set is the instability the
    ceiling answers: lowering again at each return took a memorising run's LR x0.5 every epoch
    (2^-400 over 30000 steps); a return that stands higher lowers it as before."""
    brake, optimizer, scheduler, _ = brake_on_rising_schedule()
    assert brake.pull(0, "logz_max logits", 49.7) == "brake"
    advance(optimizer, scheduler, brake, BRAKE_STEPS + 5)
    assert brake.pull(BRAKE_STEPS + 5, "logz_max logits", 37.3) == "ceiling"
    ceiling = brake.ceilings[0]
    assert ceiling is not None
    for step in range(60, 600, 60):  # the same fixed batches, the same log Z, every epoch
        assert brake.pull(step, "logz_max logits", 37.3) is None
    assert brake.ceilings == [pytest.approx(ceiling)]
    assert brake.pull(700, "adam_ratio_rms 0.weight", 3.0) == "ceiling"  # another signal
    assert brake.pull(760, "logz_max logits", 41.0) == "ceiling"  # higher: it grew on
    assert brake.ceilings[0] is not None and brake.ceilings[0] < ceiling
    restored = PrecursorBrake(optimizer, scheduler)
    restored.load_state_dict(brake.state_dict())
    assert restored.levels == {"logz_max logits": 41.0, "adam_ratio_rms 0.weight": 3.0}


def test_a_warning_during_the_ramp_sets_the_ceiling_below_the_braked_lr() -> None:
    brake, optimizer, scheduler, _ = brake_on_rising_schedule()
    brake.pull(0)
    advance(optimizer, scheduler, brake, 5)
    braked = optimizer.param_groups[0]["lr"]
    assert braked < LR * rising(5)
    assert brake.pull(5) == "ceiling"
    assert advance(optimizer, scheduler, brake, 50) == [pytest.approx(BRAKE_FACTOR * braked)] * 50


def test_a_schedule_that_decays_below_the_ceiling_takes_over() -> None:
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(nn.Linear(4, 1).parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9 ** step)
    brake = PrecursorBrake(optimizer, scheduler)
    brake.pull(0)
    brake.pull(1)  # the ceiling: half the braked LR of step 1
    seen = advance(optimizer, scheduler, brake, 60)
    assert seen[-1] == pytest.approx(LR * 0.9 ** 60)  # the schedule, under the ceiling


def test_under_recover_the_recovery_backoff_keeps_the_ceiling() -> None:
    brake, optimizer, scheduler, keeper = brake_on_rising_schedule(keeper=True)
    assert keeper is not None
    brake.pull(0)
    advance(optimizer, scheduler, brake, 5, keeper)
    braked = optimizer.param_groups[0]["lr"]
    assert brake.pull(5) == "ceiling"
    assert not brake.active and keeper.active  # one backoff scales the LR, not two
    assert keeper.ceilings == [pytest.approx(BRAKE_FACTOR * braked)]
    seen = advance(optimizer, scheduler, brake, 50, keeper)
    assert seen == [pytest.approx(BRAKE_FACTOR * braked)] * 50


def test_the_brake_state_survives_a_checkpoint() -> None:
    brake, _, _, _ = brake_on_rising_schedule()
    brake.pull(0)
    brake.pull(3)
    restored, _, _, _ = brake_on_rising_schedule()
    restored.load_state_dict(brake.state_dict())
    assert restored.pulled == [0, 3] and restored.ceilings == brake.ceilings
    assert restored.backoff.ceilings == brake.backoff.ceilings


def test_a_warning_after_a_spike_is_the_damage_and_pulls_no_brake() -> None:
    """A precursor that follows a gradient explosion or loss spike (an outlier batch throws the
    Adam ratio and log Z up after it) comes while the adaptive clip's alarm is in charge: no
    brake. A precursor alone alarms the clip too, and still pulls it."""
    from trainguard.diagnose.batch_watch import BatchWatch
    from trainguard.diagnose.incidents import IncidentProver
    from trainguard.events import Event
    from trainguard.pipeline.act import pull_brake
    from trainguard.pipeline.context import StepContext
    from trainguard.pipeline.journal import Journal
    from trainguard.pipeline.state import RunState
    from trainguard.remedies.clip_chain import ClipChain
    from trainguard.sinks import SinkSet

    def warned_at(step: int, alarms: list[tuple[int, bool]],
                  severity: str = "warning") -> list[str]:
        model = nn.Linear(2, 1)
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        state = RunState(clip=ClipChain.init(GuardConfig()), batches=BatchWatch(model, None),
                         journal=Journal(SinkSet([])), prover=IncidentProver(),
                         brake=PrecursorBrake(optimizer, None))
        for at, trouble in alarms:
            state.clip.alarm(at, trouble=trouble)
        ctx = StepContext(step=step, loss=None)
        ctx.events = [Event(kind="instability_precursor", step=step, severity=severity,  # type: ignore[arg-type]
                            message="rising", param="w", details={"signal": "logz_max"})]
        pull_brake(ctx, state)
        return [a.kind for a in ctx.actions]

    assert warned_at(81, [(80, True)]) == []  # the spike's damage
    assert warned_at(80, [(80, True), (80, False)]) == []  # in the spike's own step
    assert warned_at(81, [(81, False)]) == ["lr_change"]  # a precursor before any trouble
    assert warned_at(130, [(80, True)]) == ["lr_change"]  # long after the trouble
    # told as a trouble's aftermath (`detect/aftermath.py`: after a blown-up start or a NaN,
    # which do not alarm the clip, or with the adaptive clip off): no brake either
    assert warned_at(81, [], severity="info") == []
