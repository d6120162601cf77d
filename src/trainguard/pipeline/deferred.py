"""`sync="deferred"`: each step's skip and clip decided on the device, its update taken, and the
step judged on the host at the next one. The whole mode lives here.

    step t, before its update   measure_on_device (the ON_DEVICE stages): the pack, the skip flag
                                and the global clip on the device, the pack's copy to the host
                                started without a wait
    step t+1, after t's update  read_late -> detect -> explain -> decide -> act_late (the LATE
                                stages) on step t, then settle -> record

The shared stages never test the mode: they read what it changes, that the update was taken
before it was judged and the limit the device clipped at (`StepContext.taken_on_device`).
`Deferral` is the run's side of the mode: the step taken and not yet judged, its conclusion (a
rollback judged late drops the next step's update: the decision is `decide.undone_update`), the
report the caller gets a step late. Whether the mode is possible is said once, at the start
(`deferral_possible`).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Protocol

import torch

from trainguard.config import GuardConfig
from trainguard.distributed import AgreedPack
from trainguard.events import ActionRecord, Event, StepReport
from trainguard.pipeline.act import halt, pull_brake, roll_back
from trainguard.pipeline.context import Measured, OnDevice, StepContext, TakenOnDevice
from trainguard.pipeline.decide import decide, undone_update
from trainguard.pipeline.detect import detect
from trainguard.pipeline.explain import explain
from trainguard.pipeline.measure import pack_step, read_step
from trainguard.pipeline.policy import Decision
from trainguard.pipeline.services import Services, Stage
from trainguard.pipeline.settle import schedule_sampling
from trainguard.pipeline.state import RunState
from trainguard.pipeline.steps import StepPipeline
from trainguard.remedies import drop_grads
from trainguard.remedies.device import device_decision, scale_on_device, skips_on_device

log = logging.getLogger("trainguard")


# -- the stages of the mode ------------------------------------------------------------------------
def measure_on_device(ctx: StepContext, state: RunState, services: Services) -> None:
    """The step's skip flag and global clip decided on the device from its measured norm, the
    clip applied, and the pack's copy to the host started without a wait; `read_late` reads it
    at the next step."""
    config, device = services.config, ctx.on_device
    assert device is not None
    step = pack_step(ctx, state, services)
    # the limit in force before this step's own events, which the host judges a step later
    limit = state.clip_limit()
    ctx.taken_on_device = TakenOnDevice(limit)
    if isinstance(step.pack, AgreedPack):  # every rank skips and clips on the agreed values
        norm, loss = step.pack.agree_now()
    else:  # the loss as the pack carries it (float32), so the host's finiteness agrees
        norm, loss = step.global_norm, (step.loss.to(torch.float32) if step.loss is not None
                                        else None)
    # observe skips only what a GradScaler refuses: non-finite gradients, whatever the loss
    observe = config.policy == "observe"
    device.found_inf, coef = device_decision(norm, None if observe else loss, limit,
                                             skip=not observe or services.scaler is not None)
    if coef is not None:
        scale_on_device(step.grads, coef)
        services.watch.adam_probe.scaled(coef)
    if ctx.sampled:
        services.watch.weight_probe.remember()
    device.packed, device.in_flight = step, step.pack.start_fetch()


def read_late(ctx: StepContext, state: RunState, services: Services) -> Measured:
    """The step's measurement, from its copy (arrived while the next step ran)."""
    device, taken = ctx.on_device, ctx.taken_on_device
    assert device is not None and device.packed is not None and device.in_flight is not None
    assert taken is not None
    # the device clipped the step at the limit then in force
    measured = read_step(ctx, state, services, device.packed, device.in_flight.result(),
                         taken.limit)
    device.packed = device.in_flight = None  # the device tensors are not needed any more
    return measured


def act_late(ctx: StepContext, state: RunState, services: Services, measured: Measured,
             decision: Decision) -> None:
    """`act` for a step judged after the device skipped or clipped it and the optimizer stepped:
    what is left is a rollback (to the good state from before the trouble, which also undoes this
    step's update; the run drops the next step's update, its gradients made on the weights
    undone), a halt (of the run as it now is, the next step's gradients dropped), the LR brake
    (for the steps to come) and the record of a skip. No replay proves its causes: the state from
    before its update is gone."""
    device = ctx.on_device
    assert device is not None
    if decision.action == "rolled_back":
        roll_back(ctx, state, services, decision, mid_step=device.mid_step)
    if ctx.outcome == "halted":
        halt(ctx, state, services, measured, decision)
    elif ctx.applied:
        pull_brake(ctx, state)
    elif ctx.outcome == "skipped":
        ctx.act("skip", f"update of step {ctx.step} skipped on the device: {decision.reason}",
                reason=decision.reason)


ON_DEVICE: tuple[Stage, ...] = (measure_on_device,)
"""The device half of a step, before its update."""
LATE: tuple[Stage, ...] = (read_late, detect, explain, decide, act_late)
"""The judgement of a step whose update the device already skipped or clipped, run at the next
step (by `StepPipeline.judge`, in the shape of the blocking check)."""
GUARDED = ("measure_on_device", "read_late", "detect", "decide")
"""Stages whose failure leaves the step unchecked (it then went as the device decided)."""


# -- the run's side --------------------------------------------------------------------------------
class Host(Protocol):
    """What the mode uses of its run (`pipeline.run.Run`)."""

    config: GuardConfig
    state: RunState
    services: Services
    steps: StepPipeline
    halted: bool
    halt_step: int | None

    def halt(self, ctx: StepContext) -> None: ...

    def unguarded(self, error: Exception, *, late: bool = False) -> Event: ...

    def emit_action(self, action: ActionRecord) -> None: ...


class Deferral:
    """The step whose update was taken and is judged at the next one, and the report that comes
    back a step late. Its methods are handed the run (it holds none)."""

    def __init__(self) -> None:
        self.on_device: tuple[Stage, ...] = ON_DEVICE
        self.late_stages: tuple[Stage, ...] = LATE
        self.late: StepContext | None = None
        """The step whose update was taken, judged at the next step."""
        self.concluded: StepReport | None = None
        """The report of the step judged last, which the caller gets at this step's end."""

    @property
    def pending(self) -> int:
        """Optimizer steps taken and not yet judged (0 or 1)."""
        return int(self.late is not None)

    def before_step(self, run: Host, loss: Any, batch: Any, data_ids: Any
                    ) -> StepContext | None:
        """Judge the step before (may halt), unless a checkpoint judged it already; the step
        whose update a rollback judged now makes stale, dropped (None: the step goes on)."""
        late = self.late
        self.concluded = self.conclude(run, mid_step=True) or self.concluded
        if late is not None and late.outcome == "rolled_back":
            return self._drop(run, loss, batch, data_ids, late.step)
        return None

    def start(self, run: Host, ctx: StepContext) -> Exception | None:
        """The device half of a step, before its update. Returns its failure (the step is then
        applied unguarded, and its report wins over the step before's), None when the device
        decided it."""
        ctx.on_device = OnDevice()
        failure = run.steps.run(self.on_device, ctx, keep_carried=True, guarded=GUARDED)
        if failure is not None:
            self.concluded = None  # the sinks heard the step before; this step's report wins
            return failure
        # judged at the next step; the step after it is sampled or not now, before its forward
        self.late = ctx
        schedule_sampling(run.state, run.services, ahead=1)
        return None

    def conclude(self, run: Host, *, closing: bool = False, mid_step: bool = False
                 ) -> StepReport | None:
        """Judge the step whose update was taken last (its summary read from the copy started at
        its step), step the scheduler when its update was applied, settle and record it; its
        report (None when there was none, or its judgement failed: a `monitor_error`). A halt
        raises TrainingDiverged, as at a step, unless the run is `closing`. `mid_step`: judged
        by the next step's `before_update` (its gradients made), not between two steps."""
        ctx, self.late = self.late, None
        if ctx is None:
            return None
        assert ctx.on_device is not None
        ctx.on_device.mid_step = mid_step
        failure = run.steps.judge(self.late_stages, ctx, keep_carried=False, guarded=GUARDED)
        if failure is not None:  # the step went as the device decided; it goes unjudged
            run.state.journal.add_findings(ctx.findings)
            run.unguarded(failure, late=True)
            return None
        scheduler = run.services.scheduler
        if ctx.outcome == "halted":
            if not closing:
                run.halt(ctx)
            run.halted, run.halt_step = True, ctx.step
        elif scheduler is not None and (ctx.applied or (
                run.config.policy == "observe" and run.services.scaler is not None)):
            # the schedule follows the updates really applied (under observe, as the plain loop
            # steps it past the GradScaler's skips)
            scheduler.step()
        return run.steps.settle(ctx)

    def flush(self, run: Host) -> None:
        """Judge the step taken last now (a wait for its summary), as before a checkpoint; it may
        halt the run."""
        if self.late is not None:
            self.concluded = self.conclude(run)

    def close(self, run: Host) -> None:
        """The last step, judged before the run ends (a halt then only marks the run)."""
        if self.late is None:
            return
        try:
            self.conclude(run, closing=True)
        except Exception as exc:  # its judgement is lost (a peer too), the run still closes
            log.error("trainguard: could not judge the last step (%s: %s)",
                      type(exc).__name__, exc)

    def after_update(self, ctx: StepContext) -> StepReport | None:
        """The report the caller gets after the update of `ctx`: the step before's; a dropped
        step's own, judged already, comes next."""
        dropped = ctx.on_device.report if ctx.on_device is not None else None
        report, self.concluded = self.concluded, dropped
        return report

    @staticmethod
    def _drop(run: Host, loss: Any, batch: Any, data_ids: Any, rolled_back: int) -> StepContext:
        """Under `recover`: the step before (`rolled_back`) was just rolled back, and this step's
        gradients were made on the weights the rollback undid. Its update is dropped (the one
        extra step a rollback judged late costs), counted among the updates recovery threw away,
        and reported as skipped; nothing of it is measured."""
        state, services = run.state, run.services
        ctx = StepContext(step=state.step, loss=loss, batch=batch,
                          data_ids=state.data_position if data_ids is None else data_ids,
                          on_device=(device := OnDevice(dropped=True)))
        state.data_position += 1
        drop_grads(services.watched.params)
        for probe in (services.activation_probe, services.output_probe):
            if probe is not None and probe.attached:  # what it saw was this batch's forward
                probe.detach()
        if state.recovery is not None:
            state.recovery.rolled_back_steps += 1
        decision = undone_update(ctx.step, rolled_back)
        ctx.decide(decision)
        reason = decision.reason
        run.emit_action(ActionRecord(
            kind="skip", step=ctx.step, message=f"update of step {ctx.step} dropped: {reason}",
            details={"reason": reason, "rolled_back_at": rolled_back}))
        report = StepReport(step=ctx.step, loss=None, grad_norm=math.nan, action="skipped")
        device.report = report  # the caller gets it after the step before's
        state.journal.sinks.on_step(report)
        state.step += 1
        schedule_sampling(state, services)
        return ctx


def deferral_possible(config: GuardConfig, services: Services, owns_optimizer_step: bool
                      ) -> bool:
    """Whether `sync="deferred"` is in force; when asked for and not possible, says why once."""
    if config.sync != "deferred":
        return False
    why = None
    if not owns_optimizer_step:
        why = "the trainer takes the optimizer step (only the plain-loop Guard defers)"
    elif services.dist is not None and services.dist.device.type == "cpu" \
            and services.device.type != "cpu":
        why = "gloo serving an accelerator reduces the step's signals on the host"
    elif config.clip.rule is not None or config.clip.agc is not None:
        why = "clip.rule and clip.agc read the norms on the host"
    elif not skips_on_device(services.optimizer):
        why = (f"{type(services.optimizer).__name__} cannot skip a step on the device: use "
               f"Adam, AdamW or SGD with fused=True (SGD with momentum: after its first step)")
    # every rank or none: a deferred rank's collectives run in another order than a blocking one's
    if services.dist is not None and services.dist.agree_max(int(why is not None)) \
            and why is None:
        why = "another rank cannot defer"
    if why is not None:
        log.warning("trainguard: sync='deferred' is not available here (%s); every step is "
                    "read on the host before its update", why)
        return False
    return True
