"""Stage 6, `settle`: after the optimizer step (or its absence), bring the run to the next step.

A scheduler a trainer stepped on a skipped step is rewound; the LR backoff ramps on after an
applied update; the heavy post-update probes (weights, update ratio, optimizer state) are queued
for the next transfer on sampled steps and after an event; counters move on; the step report is
built; the adaptive clip learns the applied step's norm; the good-state ring is offered the new
state; the next step's sampling, and whether its precursor probes measure, is scheduled.
"""

from __future__ import annotations

import logging

from trainguard.events import StepReport, marks_trouble
from trainguard.pipeline.context import PendingStats, Settled, StepContext
from trainguard.pipeline.services import Services
from trainguard.pipeline.state import RunState
from trainguard.registry import is_rank_local

log = logging.getLogger("trainguard")


def settle(ctx: StepContext, state: RunState, services: Services) -> Settled:
    halted = ctx.outcome == "halted"
    queued: list[PendingStats] = []
    if not halted:
        _schedule_and_probes(ctx, state, services, queued)
    if ctx.outcome == "skipped":
        state.consecutive_skips += 1
    elif not halted:
        state.consecutive_skips = 0
    measured, decision = ctx.measured, ctx.decision
    assert measured is not None and decision is not None and ctx.outcome is not None
    signals = measured.signals
    report = StepReport(step=ctx.step, loss=signals.loss, grad_norm=signals.grad_norm,
                            action=ctx.outcome, events=ctx.events, lr=signals.lr,
                            loss_scale=signals.loss_scale, clip_coef=decision.clip_coef,
                            sampled=ctx.sampled, loss_curvature=signals.loss_curvature,
                            signals=signals)
    state.losses.observe(ctx.step, signals.loss, trouble=any(
        marks_trouble(e) for e in ctx.events))
    state.step += 1
    if halted:
        return Settled(report, queued)
    # Under torch.distributed batch findings are rank-local; sampling must stay in step on
    # every rank (sampled statistics are agreed with collectives).
    sample_next = any(services.dist is None or not is_rank_local(e.kind) for e in ctx.events)
    if ctx.applied:
        state.clip.update(signals.grad_norm, decision.clip_limit)
    if ctx.applied and state.recovery is not None:
        state.recovery.after_applied(state.step, state.rewind_state)
    if state.anchor is not None:
        state.anchor.observe(measured.extra, ctx.events, ctx.applied, step=ctx.step)
        if ctx.applied:
            state.anchor.after_applied(state.step)
    if ctx.taken_on_device is not None:
        # the next step's forward ran already: the run schedules the one after
        state.sample_next = state.sample_next or sample_next
    else:
        schedule_sampling(state, services, after_event=sample_next)
    return Settled(report, queued)


def schedule_sampling(state: RunState, services: Services, after_event: bool = False,
                      ahead: int = 0) -> None:
    """Decide before the forward pass of the next step whether it is sampled (by the schedule,
    after an event of the step before, or as a resumed run's state says); attach the activation
    and output hooks if so. `ahead`: that step is `state.step + ahead` (1 under
    `sync="deferred"`, whose steps are settled one step late)."""
    config = services.config
    state.cadence.observe(state.sampled_now)  # the step that ended
    scheduled = config.probes.sample_all_steps or state.cadence.scheduled(state.step + ahead)
    state.sampled_now = scheduled or state.sample_next or after_event
    state.sample_next = False
    if state.sampled_now:
        state.cadence.ran(state.step + ahead)
        for probe in (services.activation_probe, services.output_probe):
            if probe is not None:
                probe.attach()
    precursor = state.precursor()
    state.precursors_due = (precursor is None or state.sampled_now
                            or precursor.due(state.step + ahead))
    state.ratio_due = state.precursors_due and (precursor is None or state.sampled_now
                                                or precursor.ratio_due(state.step + ahead))
    if services.logz_probe is not None:
        services.logz_probe.armed = state.precursors_due
    attention = services.attention_probe
    # a model without attention layers (found once) has nothing to hook
    if attention is not None and attention.layers and (state.sampled_now or precursor is None
                                  or precursor.attention.due(state.step + ahead)):
        attention.attach()


def _schedule_and_probes(ctx: StepContext, state: RunState, services: Services,
                         queued: list[PendingStats]) -> None:
    weight_probe = services.watch.weight_probe
    if ctx.applied:
        if state.brake is not None:
            state.brake.after_schedule()
        if state.recovery is not None:
            state.recovery.after_schedule()
    else:
        try:
            if ctx.schedule_mark is not None:
                ctx.schedule_mark.restore()
        except Exception as exc:  # the schedule drifts by a step; training goes on
            log.error("trainguard: could not rewind the LR scheduler after a skipped step "
                      "(%s: %s)", type(exc).__name__, exc)
        weight_probe.forget()
    if ctx.sampled or ctx.fired or ctx.outcome == "rolled_back":
        try:
            per_param = weight_probe.measure(services.device)
            per_param.update(services.optstate_probe.measure(services.device))
        except Exception as exc:  # heavy probes are optional; training goes on
            log.error("trainguard: sampled probes failed at step %d (%s: %s)", ctx.step,
                      type(exc).__name__, exc)
            return
        queued.append(PendingStats(step=ctx.step, per_param=per_param))
    else:
        weight_probe.forget()
