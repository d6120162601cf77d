"""Stage 5, `act`: carry the decision out on the gradients and the training state.

    applied / clipped  the clip chain (`RunState.clip`) scales the gradients by the global clip
                       factor, then applies the clip rule and AGC (on the norms already
                       measured; no second pass over the gradients)
    skipped            drop the gradients, so the optimizer step that follows changes nothing
    rolled_back        restore the newest good state, back the LR off, tighten clipping
    halted             write a crash snapshot of the state from before this step (the pipeline
                       then records the step, closes the run and raises TrainingDiverged)

Before a halt or the first rollback, the run's `IncidentProver` (in its state) replays the
step under candidate fixes (`diagnose/incidents.py`), while the model still holds the state from
before its update.

Every change is also an `ActionRecord` that sinks hear. A remedy that fails leaves the global clip
standing; a rollback that fails halts the run cleanly.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trainguard.detect.trainer_metrics import KL, first
from trainguard.events import Event, at_least
from trainguard.pipeline.context import Measured, StepContext
from trainguard.pipeline.policy import Decision
from trainguard.pipeline.services import Services
from trainguard.pipeline.state import RunState
from trainguard.registry import Kind
from trainguard.remedies import drop_grads
from trainguard.snapshot import build_snapshot, portable, write_snapshot

if TYPE_CHECKING:
    from trainguard.recovery.kl_penalty import KLPenalty
    from trainguard.recovery.manager import Rollback

def apply_rollback(state: RunState, plan: Rollback) -> Event:
    """Apply what a rollback changes in the run's state (the baselines its good state kept, the
    tightened clipping) and return its event, which names the limit then in force. The step's
    rollbacks and `Guard.rollback` both come through here."""
    state.rewind(plan.guard_state)
    if plan.max_grad_norm is not None:
        state.clip.tighten(plan.max_grad_norm)
    return plan.event(state.clip_limit(), adaptive=state.clip.fixed_limit is None)


def act(ctx: StepContext, state: RunState, services: Services, measured: Measured,
        decision: Decision) -> None:
    prover = state.prover
    if state.anchor is not None:  # a state kept before an LR jump, checked by this transfer
        state.anchor.read(measured.extra, ctx.step)
    ring = state.good_states()
    prover.see(ctx, services, ring.good[0].step if ring is not None and len(ring) else None)
    if prover.wanted(ctx, services):  # before a rollback or a snapshot changes anything
        prover.prove(ctx, state, services)
    if decision.action == "rolled_back":
        roll_back(ctx, state, services, decision)
    if ctx.outcome == "halted":
        halt(ctx, state, services, measured, decision)
        return
    if state.anchor is not None:
        # an LR jump's proof starts from the state before its update
        state.anchor.before_update(ctx.events, ctx.step, measured.signals.group_lrs)
    if ctx.applied:
        uniform = state.clip.apply(measured.grads, services.watched.params, measured.signals,
                                   decision.clip_coef, ctx.step)
        if uniform and decision.clip_coef != 1.0:  # Adam's carried sum of v follows the clip
            services.watch.adam_probe.scaled(torch.tensor(decision.clip_coef))
        if ctx.sampled:
            services.watch.weight_probe.remember()
        pull_brake(ctx, state)
    if state.kl_penalty is not None:
        follow_kl(ctx, state.kl_penalty, measured)
    if not ctx.applied:
        if services.config.policy != "observe":  # observe leaves grads and schedule as they are
            drop_grads(services.watched.params)
            ctx.schedule_mark = services.rewind.remember()
        if ctx.outcome == "skipped":
            ctx.act("skip", f"update of step {ctx.step} skipped: {decision.reason}",
                    reason=decision.reason)


def follow_kl(ctx: StepContext, penalty: KLPenalty, measured: Measured) -> None:
    """A KL that drifted away unheld raises the KL penalty, which then follows the KL
    (`recovery/kl_penalty.py`); the loss reads it from the next step on."""
    found = first(measured.signals.trainer_metrics, KL)
    message = penalty.follow(ctx.events, found[1] if found is not None else None)
    if message is not None:
        ctx.act("kl_penalty", message, beta=penalty.beta, given=penalty.given,
                target=penalty.target)


def pull_brake(ctx: StepContext, state: RunState) -> None:
    """An `instability_precursor` warning pulls the LR brake before the update is applied; one
    that comes back sets a lasting LR ceiling (`recovery.brake`)."""
    brake, recovery = state.brake, state.recovery
    warning = next((e for e in ctx.events if e.kind == Kind.INSTABILITY_PRECURSOR
                    and at_least(e.severity, "warning")), None)  # not a trouble's aftermath
    if brake is None or warning is None or (recovery is not None and recovery.lr.active):
        return
    if state.clip.after_trouble(ctx.step):
        # after a spike or explosion (this step's included) the warning is the damage, not a
        # precursor: the adaptive clip's alarm is in charge, and a brake would only slow the
        # run down for good (an outlier batch's Adam ratio and log Z rise after it)
        return
    signal = f"{warning.details.get('signal') or 'adam_ratio_rms'} {warning.param or ''}"
    pulled = brake.pull(ctx.step, signal, float(warning.value)
                        if isinstance(warning.value, (int, float)) else math.nan)
    where = (f"{warning.param or 'a parameter'}'s Adam ratio rose"
             if warning.details.get("signal") in (None, "adam_ratio_rms")
             else f"{warning.details['signal']} of {warning.param or 'a parameter'} rose")
    if pulled == "brake":
        ctx.act("lr_change", f"LR x{brake.factor:g} ahead of a likely loss spike ({where}), "
                             f"back to the schedule over {brake.steps} updates",
                factor=brake.factor, release_steps=brake.steps, reason=warning.kind)
    elif pulled == "ceiling":
        first = next((c for c in brake.ceilings if c is not None), None)
        ctx.act("lr_change", f"the precursor came back ({where}): LR never above "
                             f"{first:.3g} ({brake.factor:g}x the LR it came back at) for the "
                             f"rest of the run",
                factor=brake.factor, ceiling=first, ceilings=list(brake.ceilings),
                reason=warning.kind)


def roll_back(ctx: StepContext, state: RunState, services: Services, decision: Decision, *,
              mid_step: bool = True) -> None:
    """Roll back to the newest good state from before the trouble (`mid_step`: the caller's
    GradScaler step of the step under way is open, and is closed first); a failed restore
    halts."""
    recovery = state.recovery
    assert recovery is not None
    lr_before = recovery.lr.factor()
    try:
        event = apply_rollback(state, recovery.rollback(
            decision.verdict, ctx.step, mid_step=services.owns_scaler_step and mid_step,
            keep_lr=state.prover.data_fault(ctx.step)))
    except Exception as exc:  # a failed restore leaves an unknown state: stop cleanly
        ctx.raise_event(Event(
            kind="rollback_failed", step=ctx.step, severity="critical",
            message=f"{decision.reason}; the rollback failed ({type(exc).__name__}: "
                    f"{exc})"))
        ctx.outcome = "halted"
        return
    ctx.raise_event(event)
    ctx.act("rollback", event.message, **event.details)
    if recovery.lr.factor() != lr_before:
        ceiling = event.details.get("lr_ceiling")
        ctx.act("lr_change", f"LR x{recovery.lr.factor():g} after the rollback, ramping back"
                             + (f", never above LR {ceiling:.3g}" if ceiling is not None
                                else ""),
                factor=recovery.lr.factor(), ceiling=ceiling)


def halt(ctx: StepContext, state: RunState, services: Services, measured: Measured,
         decision: Decision) -> None:
    """Snapshot the state from before this step's update; whatever runs next applies
    nothing."""
    path = snapshot_path(services, ctx.step)
    if path is not None:  # None: a replica of rank 0's state, rank 0's snapshot holds it all
        try:
            snapshot = build_snapshot(
                step=ctx.step, model=services.model, optimizers=[services.optimizer],
                scheduler=services.scheduler, scaler=services.scaler, batch=ctx.batch,
                events=[e.to_dict() for e in state.journal.events + ctx.events],
                config=services.config.to_dict(),
                extra={"guard": portable(state.state_dict()),
                       "baseline": state.prover.baseline_dict(),
                       # the last good batch, for `trainguard prove`'s "the previous batch" fix
                       "previous_batch": state.prover.previous_batch,
                       # the loss the step had, which a faithful replay gives again
                       "step_loss": (None if measured.signals.loss is None
                                     else float(measured.signals.loss))},
                forward_rng=ctx.forward_rng)
            ctx.snapshot_path = str(write_snapshot(path, snapshot))
            ctx.act("snapshot", f"crash snapshot written to {ctx.snapshot_path}",
                    path=ctx.snapshot_path)
        except Exception as exc:  # still halt, and say why there is no snapshot
            ctx.raise_event(Event(kind="snapshot_failed", step=ctx.step, severity="error",
                                  message=f"could not write {path}: {exc}"))
    drop_grads(services.watched.params)
    reason = decision.reason
    ctx.act("halt", f"training halted at step {ctx.step}: {reason}", reason=reason,
            snapshot=ctx.snapshot_path)


def snapshot_path(services: Services, step: int) -> Path | None:
    """Rank 0 writes `crash_step<N>.pt`; under torch.distributed the other ranks write only
    when their state is sharded (FSDP), as `crash_step<N>_rank<r>.pt` beside it (None: this
    rank writes nothing, its state being a replica of rank 0's)."""
    base, dist = services.snapshot_dir(), services.dist
    if dist is None or dist.is_main:
        return base / f"crash_step{step}.pt"
    if services.ranks is not None and services.ranks.sharded:
        return base / f"crash_step{step}_rank{dist.rank}.pt"
    return None
