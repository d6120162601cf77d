"""Stage 6, `settle`: after the optimizer step (or its absence), bring the run to the next step.

A scheduler a trainer stepped on a skipped step is rewound; the LR backoff ramps on after an
applied update; the heavy post-update probes (weights, update ratio, optimizer state) are queued
for the next transfer on sampled steps and after an event; counters move on; the step report is
built; the adaptive clip learns the applied step's norm; the good-state ring is offered the new
state; the next step's sampling is scheduled.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from trainguard.events import StepReport, at_least
from trainguard.pipeline.context import PendingStats, StepContext
from trainguard.registry import is_rank_local

if TYPE_CHECKING:
    from trainguard.pipeline.run import Run

log = logging.getLogger("trainguard")


class Settle:
    name = "settle"

    def __init__(self, run: Run) -> None:
        self.run = run

    def __call__(self, ctx: StepContext) -> None:
        run, state = self.run, self.run.state
        halted = ctx.outcome == "halted"
        if not halted:
            self._schedule_and_probes(ctx)
        if ctx.outcome == "skipped":
            state.consecutive_skips += 1
        elif not halted:
            state.consecutive_skips = 0
        signals = ctx.signals
        assert signals is not None and ctx.decision is not None and ctx.outcome is not None
        ctx.report = StepReport(step=ctx.step, loss=signals.loss, grad_norm=signals.grad_norm,
                                action=ctx.outcome, events=ctx.events, lr=signals.lr,
                                loss_scale=signals.loss_scale, clip_coef=ctx.decision.clip_coef,
                                sampled=ctx.sampled, loss_curvature=signals.loss_curvature,
                                signals=signals)
        state.losses.observe(ctx.step, signals.loss, trouble=any(
            at_least(e.severity, "warning") for e in ctx.events))
        state.step += 1
        if halted:
            return
        # Under torch.distributed batch findings are rank-local; sampling must stay in step on
        # every rank (sampled statistics are agreed with collectives).
        ctx.sample_next = any(run.dist is None or not is_rank_local(e.kind)
                              for e in ctx.events)
        if ctx.applied and state.auto_clip is not None:
            limit = ctx.clip_limit
            state.auto_clip.observe(signals.grad_norm, limit if limit is not None else
                                    float("inf"))
        if ctx.applied and state.recovery is not None:
            state.recovery.after_applied(state.step, state.rewind_state)
        run.schedule_sampling(after_event=ctx.sample_next)

    def _schedule_and_probes(self, ctx: StepContext) -> None:
        run = self.run
        if ctx.applied:
            if run.state.recovery is not None:
                run.state.recovery.after_schedule()
        else:
            try:
                run.rewind.restore()
            except Exception as exc:  # the schedule drifts by a step; training goes on
                log.error("trainguard: could not rewind the LR scheduler after a skipped step "
                          "(%s: %s)", type(exc).__name__, exc)
            run.weight_probe.forget()
        if ctx.sampled or ctx.fired or ctx.outcome == "rolled_back":
            try:
                per_param = run.weight_probe.measure(run.device)
                per_param.update(run.optstate_probe.measure(run.device))
            except Exception as exc:  # heavy probes are optional; training goes on
                log.error("trainguard: sampled probes failed at step %d (%s: %s)", ctx.step,
                          type(exc).__name__, exc)
                return
            ctx.queued.append(PendingStats(step=ctx.step, per_param=per_param))
        else:
            run.weight_probe.forget()
