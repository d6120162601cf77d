"""Stage 4, `decide`: the one place where a step's fate is chosen.

`judge` is the decision itself, a function of what the step showed and of what the run holds
(`ClipLimits`, `PolicyState`) that touches no model, optimizer or run: first the limit in force
and the adaptive clip's alarm, then the base policy (`policy.choose_action`: observe, protect,
halt) on the step's signals and its shared events; then, under `recover`, the recovery's
judgement, which may turn the base decision into a skip, a rollback or a halt; last, a rollback
that an earlier proof says cannot heal the run becomes a halt. Rank-local events (batch
findings) never drive a decision: under torch.distributed they differ between ranks, and every
rank must decide alike. The `decide` stage gathers the inputs, carries out the alarm on the
adaptive clip and returns the decision, which the pipeline sets on the step, immutable once
made. `undone_update` is the decision on a
step whose gradients a rollback judged late made stale.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from trainguard.config import GuardConfig
from trainguard.errors import PeerLost
from trainguard.events import Event
from trainguard.pipeline.context import Detected, Measured, StepContext
from trainguard.pipeline.policy import ClipAlarm, Decision, choose_action
from trainguard.pipeline.services import Services
from trainguard.pipeline.state import RunState
from trainguard.registry import Kind, Tag, is_rank_local, kinds_tagged
from trainguard.remedies.limit import ClipLimits
from trainguard.signals import StepSignals

if TYPE_CHECKING:
    from trainguard.recovery.controller import Verdict

log = logging.getLogger("trainguard")


class Judgement(Protocol):
    """The recover policy's side of a decision (`recovery.manager.Recovery`, bound to the
    step's facts)."""

    def review(self, events: list[Event], applies_update: bool) -> Verdict | None: ...

    def can_roll_back(self) -> bool: ...

    def rollbacks(self) -> int: ...


@dataclass(frozen=True, slots=True)
class PolicyState:
    """What the run brings to a decision besides the step's signals and events."""

    config: GuardConfig
    consecutive_skips: int = 0
    recovery: Judgement | None = None
    """The recover policy's judgement (None: not under `recover`)."""
    on_device: bool = False
    """The device skipped or clipped the step at `ClipLimits.device` and its update was applied
    before it was judged (`sync="deferred"`)."""
    unhealable: Event | None = None
    """The event that halts the run instead of a rollback: an earlier proof confirmed a fault
    that a rollback cannot change (None: none)."""


def judge(signals: StepSignals, events: Sequence[Event], limits: ClipLimits,
          policy: PolicyState) -> Decision:
    """The step's decision; `events` are all of the step's events (rank-local ones included)."""
    shared = [e for e in events if not is_rank_local(e.kind)]
    alarm = _clip_alarm(shared) if limits.adaptive is not None and shared else None
    if policy.on_device:  # the device clipped at the limit in force before this step's events
        in_force = limits.device
        adaptive = limits.adaptive is not None and in_force != limits.fixed
    else:
        in_force = limits.in_force(alarm is not None)
        adaptive = limits.adaptive_in_force(alarm is not None)
    decision = choose_action(policy.config, signals, shared, policy.consecutive_skips,
                             max_grad_norm=in_force, adaptive=adaptive)
    if policy.recovery is not None:
        decision = _recover(signals.step, [*events, *decision.events], decision,
                            policy.recovery, policy.on_device)
    if decision.action == "rolled_back" and policy.unhealable is not None:
        # a rollback cannot heal what comes back; the verdict stays for the proof of the step
        decision = dataclasses.replace(decision, action="halted", instead_of="rolled_back",
                                       events=(*decision.events, policy.unhealable))
    return decision.with_clip(in_force, alarm)


def _clip_alarm(shared: list[Event]) -> ClipAlarm | None:
    """Whether the step's shared events put the adaptive clip in alarm: trouble, or only a
    precursor (this step is clipped at the typical norm already)."""
    alarm = kinds_tagged(Tag.CLIP_ALARM)
    kinds = {e.kind for e in shared if e.kind in alarm}
    if not kinds:
        return None
    return "precursor" if kinds == {Kind.INSTABILITY_PRECURSOR} else "trouble"


def _recover(step: int, events: list[Event], decision: Decision, recovery: Judgement,
             on_device: bool) -> Decision:
    """Let the recover policy turn the decision into a skip, a rollback or a halt."""
    try:
        verdict = recovery.review(events, decision.applies_update)
    except PeerLost:  # a rank is gone: the run stops
        raise
    except Exception as exc:  # judgement is advisory; the policy's decision stands
        log.error("trainguard: recovery review failed (%s: %s)", type(exc).__name__, exc)
        return decision
    if verdict is None or decision.action == "halted":
        return decision
    if verdict.action == "skip":
        if not decision.applies_update:
            return decision
        if on_device:
            # the device applied this finite update before the host could judge it (a spike's,
            # an explosion's): it stands, and the trouble is followed as after a skip; a loss
            # that does not come back rolls back to before it
            return dataclasses.replace(
                decision, reason=f"{verdict.reason} (under sync='deferred' it was applied "
                                 f"before it was judged)")
        return dataclasses.replace(decision, action="skipped", clip_coef=1.0,
                                   reason=verdict.reason)
    if verdict.action == "rollback" and recovery.can_roll_back():
        return dataclasses.replace(decision, action="rolled_back", clip_coef=1.0,
                                   reason=verdict.reason, verdict=verdict)
    why = verdict.reason if verdict.action == "halt" else \
        f"{verdict.reason}, and there is no good state to roll back to"
    limit = Event(kind="rollback_limit", step=step, severity="critical",
                  message=f"{why}: recovery gives up", value=float(recovery.rollbacks()))
    return dataclasses.replace(decision, action="halted", reason=why,
                               events=(*decision.events, limit))


def undone_update(step: int, rolled_back: int) -> Decision:
    """Step `step`'s gradients were made on the weights that the rollback of step
    `rolled_back`, judged after that update (`sync="deferred"`), undid: its update is
    dropped."""
    return Decision("skipped", reason=f"its gradients were made on the weights the rollback at "
                                      f"step {rolled_back} undid")


@dataclass(frozen=True, slots=True)
class _StepJudgement:
    """`Recovery` bound to one step's facts, as `judge` asks for it."""

    ctx: StepContext
    state: RunState
    measured: Measured
    found: Detected

    def review(self, events: list[Event], applies_update: bool) -> Verdict | None:
        recovery, measured = self.state.recovery, self.measured
        assert recovery is not None
        return recovery.review(measured.signals, measured.extra, events, applies_update,
                               self.ctx.data_ids, nonfinite_input=self.found.nonfinite_input)

    def can_roll_back(self) -> bool:
        assert self.state.recovery is not None
        return self.state.recovery.can_roll_back()

    def rollbacks(self) -> int:
        assert self.state.recovery is not None
        return self.state.recovery.controller.rollbacks


def decide(ctx: StepContext, state: RunState, services: Services, measured: Measured,
           found: Detected) -> Decision:
    """The step's decision, from its measurement and what `detect` found; the adaptive clip's
    alarm is carried out on the clip chain."""
    taken = ctx.taken_on_device
    # the limits `measure` read (the chain has not moved since), else the chain's now
    limits = measured.limits if measured.limits is not None else state.clip.limits(state.step)
    if taken is not None:
        limits = dataclasses.replace(limits, device=taken.limit)
    policy = PolicyState(
        config=services.config, consecutive_skips=state.consecutive_skips,
        recovery=(None if state.recovery is None
                  else _StepJudgement(ctx, state, measured, found)),
        on_device=taken is not None, unhealable=state.prover.precision_fault(ctx.step))
    decision = judge(measured.signals, found.events, limits, policy)
    if decision.clip_alarm is not None:
        state.clip.alarm(ctx.step, trouble=decision.clip_alarm == "trouble")
    return decision
