"""Stage 4, `decide`: the one place where a step's fate is chosen.

First the base policy (`policy.choose_action`: observe, protect, halt) on the step's signals and
its shared events; then, under `recover`, the recovery's judgement, which may turn the base
decision into a skip, a rollback or a halt. Rank-local events (batch findings) never drive a
decision: under torch.distributed they differ between ranks, and every rank must decide alike.
The decision is immutable once made.
"""

from __future__ import annotations

import dataclasses
import logging

from trainguard.errors import PeerLost
from trainguard.events import Event
from trainguard.pipeline.context import StepContext
from trainguard.pipeline.policy import Decision, choose_action
from trainguard.pipeline.services import Services
from trainguard.pipeline.state import RunState
from trainguard.registry import Kind, Tag, is_rank_local, kinds_tagged

log = logging.getLogger("trainguard")

def decide(ctx: StepContext, state: RunState, services: Services) -> None:
    signals, config = ctx.signals, services.config
    assert signals is not None
    shared = [e for e in ctx.events if not is_rank_local(e.kind)]
    alarm = kinds_tagged(Tag.CLIP_ALARM)  # the kinds that put the adaptive clip in alarm
    if state.auto_clip is not None and any(e.kind in alarm for e in shared):
        # this step is clipped at the typical norm already; trouble, or only a precursor
        state.auto_clip.alarm(ctx.step, trouble=any(
            e.kind in alarm and e.kind != Kind.INSTABILITY_PRECURSOR for e in shared))
    if ctx.deferred:  # the device clipped at the limit in force before this step's events
        limit = ctx.clip_limit
    else:
        limit = state.clip_limit()
        # the one computation of the step's limit (the fixed one, when the state has none)
        ctx.clip_limit = config.clip.fixed if limit is None else limit
    decision = choose_action(config, signals, shared, state.consecutive_skips,
                             max_grad_norm=ctx.clip_limit,
                             adaptive=state.auto_clip is not None
                             and limit != state.max_grad_norm)
    if state.recovery is not None:
        decision = _recover(ctx, state, decision)
    ctx.decide(decision)


def _recover(ctx: StepContext, state: RunState, decision: Decision) -> Decision:
    """Let the recover policy turn the decision into a skip, a rollback or a halt."""
    recovery = state.recovery
    assert recovery is not None and ctx.signals is not None
    events = ctx.events + list(decision.events)
    try:
        verdict = recovery.review(ctx.signals, ctx.extra, events, decision.applies_update,
                                  ctx.data_ids,
                                  nonfinite_input=ctx.nonfinite_input)
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
        if ctx.deferred:
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
    limit = Event(kind="rollback_limit", step=ctx.step, severity="critical",
                  message=f"{why}: recovery gives up",
                  value=float(recovery.controller.rollbacks))
    return dataclasses.replace(decision, action="halted", reason=why,
                               events=(*decision.events, limit))
