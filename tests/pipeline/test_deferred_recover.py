"""`policy="recover"` under `sync="deferred"`: a rollback judged one step late.

The host judges step t at step t+1, after t's update; a rollback then restores the same good
state the blocking run restores (the ring keeps states from before updates), and drops the
update of step t+1, whose gradients were made on the weights it undid."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from trainguard import Guard, GuardConfig, RecoveryConfig
from trainguard.events import StepReport
from trainguard.transfer import blocking_transfer_count

from ..conftest import Actions, make_setup

RING = RecoveryConfig(ring_every=4, confirm_steps=2, ring_budget=None)
"""A fixed cadence: which states are good does not depend on the machine's timings."""


def recover(sync: str, **options: Any) -> GuardConfig:
    return GuardConfig(policy="recover", sync=sync, recovery=RING, sinks={"console": False},
                       clip={"max_grad_norm": 0.5}, **options)


@dataclass
class Recorded:
    guard: Guard
    weights: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    """The model's weights once each call of `guard.step` returned."""
    reports: list[StepReport] = field(default_factory=list)
    blocking: list[int] = field(default_factory=list)
    actions: Actions = field(default_factory=Actions)


def train(config: GuardConfig, steps: int, bad: tuple[int, ...] = ()) -> Recorded:
    setup = make_setup()
    optimizer = torch.optim.AdamW(setup.model.parameters(), lr=3e-3, weight_decay=0.01,
                                  fused=True)
    actions = Actions()
    guard = Guard(setup.model, optimizer, config=config, sinks=[actions])
    out = Recorded(guard, actions=actions)
    for step in range(steps):
        batch = setup.batch()
        loss = setup.model.loss(batch)
        if step in bad:
            loss = loss * math.nan
        loss.backward()
        blocked = blocking_transfer_count()
        report = guard.step(loss, batch=batch)
        out.blocking.append(blocking_transfer_count() - blocked)
        if report is not None:
            out.reports.append(report)
        optimizer.zero_grad(set_to_none=True)
        out.weights[step] = [p.detach().clone() for p in setup.model.parameters()]
    guard.close()
    return out


def test_recover_defers_instead_of_falling_back() -> None:
    assert train(recover("deferred"), steps=3).guard.run.deferred


def test_a_late_rollback_restores_the_state_the_blocking_rollback_restores() -> None:
    """Three NaN steps in a row (11-13) roll back at step 13 in both modes, to the good state
    from step 8; the deferred run decides it at the call of step 14 and drops step 14's update.
    """
    bad = (11, 12, 13)
    blocking = train(recover("blocking"), steps=24, bad=bad)
    deferred = train(recover("deferred"), steps=24, bad=bad)
    assert deferred.guard.run.deferred
    rollbacks = [[e for e in run.guard.events if e.kind == "rollback"]
                 for run in (blocking, deferred)]
    assert [(e.step, e.details["to_step"]) for e in rollbacks[0]] == [(13, 8)]
    assert [(e.step, e.details["to_step"]) for e in rollbacks[1]] == [(13, 8)]
    assert rollbacks[0][0].message == rollbacks[1][0].message
    # the same good state: the blocking weights after its rollback call are the deferred ones
    # after the call that judged step 13 (which dropped step 14)
    for p, q in zip(blocking.weights[13], deferred.weights[14], strict=True):
        assert torch.equal(p, q)
    # up to the trouble both runs trained alike
    for p, q in zip(blocking.weights[10], deferred.weights[10], strict=True):
        assert torch.equal(p, q)
    # the actions: the same skips, the same rollback step, and step 14 dropped
    kinds = [(a.kind, a.step) for a in blocking.actions.actions]
    late = [(a.kind, a.step) for a in deferred.actions.actions]
    assert [a for a in kinds if a[0] in ("skip", "rollback")] == \
        [("skip", 11), ("skip", 12), ("rollback", 13)]
    assert [a for a in late if a[0] in ("skip", "rollback")] == \
        [("skip", 11), ("skip", 12), ("rollback", 13), ("skip", 14)]
    dropped = next(a for a in deferred.actions.actions if a.step == 14)
    assert "rollback at step 13" in dropped.message
    recovery_b, recovery_d = blocking.guard.recovery, deferred.guard.recovery
    assert recovery_b is not None and recovery_d is not None
    assert recovery_d.rolled_back_steps == recovery_b.rolled_back_steps + 1
    # the events carry the step they happened at, in both modes
    assert [(e.kind, e.step) for e in deferred.guard.events] == \
        [(e.kind, e.step) for e in blocking.guard.events]
    # the run goes on: every step after the rollback is reported, trained and finite
    by_step = {r.step: r for r in deferred.reports}
    assert by_step[13].action == "rolled_back"
    assert all(by_step[s].action in ("applied", "clipped") for s in range(15, 23))
    assert deferred.guard.global_step == 24
    assert all(torch.isfinite(p).all() for p in deferred.weights[23])
    assert not any(torch.equal(p, q) for p, q in zip(deferred.weights[14], deferred.weights[23],
                                                      strict=True))


def test_a_steady_recover_step_makes_no_blocking_transfer() -> None:
    """The ring's copies (every 4 steps here) are host copies, not reads the host waits on: no
    steady step blocks, those with a capture included."""
    deferred = train(recover("deferred"), steps=16)
    blocking = train(recover("blocking"), steps=16)
    assert deferred.blocking[2:] == [0] * 14
    assert blocking.blocking[2:] == [1] * 14
    recovery = deferred.guard.recovery
    assert recovery is not None and len(recovery.ring) >= 2  # states were kept meanwhile


def test_a_late_spike_is_applied_and_followed() -> None:
    """A finite spike that `recover` skips in the blocking mode has been applied by the time
    the deferred host judges it: the update stands, the trouble is followed as after a skip."""
    setup = make_setup()
    optimizer = torch.optim.AdamW(setup.model.parameters(), lr=3e-3, fused=True)
    guard = Guard(setup.model, optimizer, config=recover("deferred"))
    reports = []
    for step in range(40):
        batch = setup.batch()
        loss = setup.model.loss(batch) * (50.0 if step == 30 else 1.0)
        loss.backward()
        report = guard.step(loss, batch=batch)
        if report is not None:
            reports.append(report)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    by_step = {r.step: r for r in reports}
    assert {"loss_spike"} & {e.kind for e in by_step[30].events}
    assert by_step[30].action in ("applied", "clipped")
    recovery = guard.recovery
    assert recovery is not None and recovery.controller.trouble is None  # it settled


def test_a_checkpoint_between_steps_judges_a_rollback_without_dropping_a_step() -> None:
    """`state_dict()` judges the last step now: a rollback decided there restores the good state
    before the next forward pass, so the next step's update is kept."""
    setup = make_setup()
    optimizer = torch.optim.AdamW(setup.model.parameters(), lr=3e-3, fused=True)
    actions = Actions()
    guard = Guard(setup.model, optimizer, config=recover("deferred"), sinks=[actions])
    for step in range(16):
        batch = setup.batch()
        loss = setup.model.loss(batch) * (math.nan if step in (11, 12, 13) else 1.0)
        loss.backward()
        guard.step(loss, batch=batch)
        optimizer.zero_grad(set_to_none=True)
        if step == 13:
            guard.state_dict()
    guard.close()
    assert [(a.kind, a.step) for a in actions.actions if a.kind in ("skip", "rollback")] == \
        [("skip", 11), ("skip", 12), ("rollback", 13)]


def test_a_late_rollback_with_a_grad_scaler_restores_its_scale() -> None:
    """The rollback closes the GradScaler step the next call opened (its unscale) and puts the
    scale back as the blocking rollback does; the dropped step takes no scaler step."""
    scales = {}
    for sync in ("blocking", "deferred"):
        setup = make_setup()
        optimizer = torch.optim.AdamW(setup.model.parameters(), lr=3e-3, fused=True)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
        guard = Guard(setup.model, optimizer, scaler=scaler, config=recover(sync))
        seen = []
        for step in range(20):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = setup.model.loss(setup.batch())
            if step in (11, 12, 13):
                loss = loss * math.nan
            scaler.scale(loss).backward()
            guard.step(loss)
            seen.append(scaler.get_scale())
            optimizer.zero_grad(set_to_none=True)
        guard.close()
        assert guard.run.deferred == (sync == "deferred")
        assert [e.step for e in guard.events if e.kind == "rollback"] == [13]
        scales[sync] = seen
    assert scales["deferred"][14] == scales["blocking"][13]  # the good state's scale, restored
