"""`Guard`: trainguard in a plain PyTorch loop, where it takes the optimizer step itself.

    guard = trainguard.Guard(model, optimizer, scheduler, scaler, run_dir="runs/exp1")
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()                      # or scaler.scale(loss).backward()
        report = guard.step(loss, batch=batch)
        optimizer.zero_grad(set_to_none=True)
    guard.close()

`guard.step` replaces clip_grad_norm_ + optimizer.step() + scheduler.step() (and the scaler's
unscale_/step/update). On a skipped step the scheduler does not advance: the schedule follows the
updates that were really applied. Under `observe` a step the GradScaler skips still advances
the scheduler, as the loop without trainguard does (`observe` changes nothing in training).
Everything around the step is the `Run` (`before_update`, `after_update`), which the framework
callbacks use too: the Guard only takes the optimizer step.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainguard.checkpoints import CheckpointHealth
from trainguard.config import GuardConfig
from trainguard.diagnose import Finding
from trainguard.diagnose.counterfactual import Proof
from trainguard.diagnose.replay import LossFn
from trainguard.errors import UsageError
from trainguard.eval_mode import EvalModeSteps
from trainguard.events import Event, StepReport
from trainguard.outside_steps import OutsideScheduleSteps, OutsideSteps
from trainguard.pipeline.run import Run
from trainguard.probes.samples import SampleFn
from trainguard.ranked_cause import RankedCause
from trainguard.recovery import Recovery
from trainguard.remedies.device import skip_on_device
from trainguard.run_end import exit_status
from trainguard.samples_seen import SamplesSeen
from trainguard.sinks import Sink
from trainguard.stale_grads import StaleGrads
from trainguard.verdict import RunVerdict
from trainguard.vocabulary import Status

log = logging.getLogger("trainguard")


class Guard:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None,
                 scaler: Any = None, *, config: GuardConfig | None = None,
                 run_dir: str | Path | None = None, sinks: list[Sink] | None = None,
                 replay_fn: LossFn | None = None, resume: bool = False,
                 sample_fn: SampleFn | None = None, noise_scheduler: Any = None,
                 kl_penalty: Any = None) -> None:
        """`replay_fn(model, batch) -> loss`: when given, a step with an error-level event is
        replayed on the state from before its update to name the first bad module and
        parameter. `sample_fn(model) -> images` (N x C x H x W): for a generative model, a few
        samples from a fixed seed, made after every `probes.samples_every` steps at most (within
        `probes.samples_budget` of the training time) and judged against the run's first ones:
        colour noise, flat or blown-out images, every sample alike (`samples_degraded`).
        `noise_scheduler`: a diffusion loop's (a diffusers `DDPMScheduler`, ...): the first steps'
        loss is checked against the target its `prediction_type` names (finding
        `diffusion_target`, cause `prediction_type_mismatch`). `kl_penalty`: in an RL loop with a
        KL penalty, an object whose `beta` attribute the loss reads every step; when the KL
        drifts away unheld (`kl_blowup`, cause `beta_too_low`) the recover policy raises it and
        then holds the KL near its level before the drift.
        A Guard given a `run_dir` that holds earlier runs records a new run there;
        `resume=True` continues the latest one instead (with `load_state_dict` of the Guard's
        saved state for a job restarted from a checkpoint)."""
        _check_scheduler(scheduler)
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.run = Run(model, optimizer, config=config or GuardConfig(), run_dir=run_dir,
                       sinks=sinks or (), scaler=scaler, scheduler=scheduler, replay_fn=replay_fn,
                       owns_scaler_step=True, resume=resume, mid_run=resume,
                       owns_optimizer_step=True, noise_scheduler=noise_scheduler,
                       kl_penalty=kl_penalty)
        self.scaler = self.run.scaler
        self.config = self.run.config
        self._outside = OutsideSteps(optimizer)
        """The loop's own `optimizer.step()` calls, told once (`outside_steps.py`)."""
        self._outside_schedule = OutsideScheduleSteps(
            scheduler if self.config.sync != "deferred" else None)
        """The loop's own `scheduler.step()` calls on the Guard's scheduler, told once (not
        under `sync="deferred"`, whose pending step the Guard may conclude between calls)."""
        self._stale = StaleGrads(_trained(model, optimizer))
        """Gradients the loop never clears, told once (`stale_grads.py`)."""
        self._eval_mode = EvalModeSteps(model)
        """A model that trains in eval mode, told once (`eval_mode.py`)."""
        self._samples = (SamplesSeen(sample_fn, self.config) if sample_fn is not None
                         else None)
        self.run.open_calm_lane()  # calm steps in a few operations (`pipeline/calm.py`)

    # -- public API ------------------------------------------------------------------------------
    @property
    def events(self) -> list[Event]:
        """Every event so far, in order."""
        self.run.calm_handed_over()
        return self.run.events

    @property
    def findings(self) -> list[Finding]:
        """What the preflight audit (and the runtime checks) found, worst first at the start."""
        self.run.calm_handed_over()
        return self.run.findings

    @property
    def recovery(self) -> Recovery | None:
        """The `recover` policy's ring, judgement, LR backoff and skip list (None otherwise)."""
        return self.run.state.recovery

    @property
    def verdict(self) -> RunVerdict | None:
        """Whether training worked, once the Guard is closed: `healthy`, `recovered` (trouble
        came and the loss ended no worse than before it) or `degraded` (it ended worse than
        before its first trouble, or than its start), with the figures."""
        return self.run.verdict

    @property
    def global_step(self) -> int:
        """Number of steps taken so far (the index of the next step)."""
        return self.run.steps_taken

    @property
    def skipped_data(self) -> set[Any]:
        """Data ids that rollbacks blamed (see `trainguard.recovery.SkippingSampler`)."""
        recovery = self.run.state.recovery
        return recovery.skipped_data if recovery is not None else set()

    def step(self, loss: Any, *, batch: Any = None, data_ids: Any = None,
             metrics: Mapping[str, float] | None = None) -> StepReport | None:
        """Check the gradients of this step, then apply, clip, skip, roll back or halt.

        Call after `loss.backward()` (or `scaler.scale(loss).backward()`), with the unscaled loss.
        `data_ids` names the data of this step for the `recover` policy's skip list (for example
        the dataset indices of the batch); by default it is the batch's running position.
        `metrics` are the step's own training metrics, under the names TRL logs
        (`rewards/chosen`, `rewards/rejected`, `kl`, `reward`, `reward_std`, `entropy`,
        `completions/clipped_ratio`...), for a loop that computes its own DPO or GRPO loss:
        the RL detectors judge them with the step (see docs/rl.md). A loop whose loss is a
        policy-gradient surrogate (GRPO's, near 0 by design) passes `None` as the loss: its
        level says nothing of progress, and the step is judged on its gradients and metrics.

        Under `GuardConfig(sync="deferred")` the step is skipped or clipped on the device and
        judged at the next call: the report returned is the step before's (None at the first),
        and the scheduler steps for an applied update at the next call (or at `close`);
        the step's `metrics` travel with it and are judged with it, a call late.
        """
        if self.run.closed:
            self.run.raise_if_peer_lost()
            raise UsageError("this Guard is closed; create a new one to keep training")
        loop_faults = [event for event in (self._outside.check(self.run.steps_taken),
                                           self._outside_schedule.check(self.run.steps_taken),
                                           self._stale.check(),
                                           self._eval_mode.check(self.run.steps_taken))
                       if event is not None]
        for event in loop_faults:
            self.run.emit_event(event)
        if self._samples is not None:
            self._samples.before_first_update(self.model, self.run)
        try:
            report = self._step(loss, batch, data_ids, metrics)
        finally:
            self._outside.step_ended()
            self._outside_schedule.step_ended()
            self._stale.step_ended(self.run.steps_taken)
            self._eval_mode.step_ended()
        if self._samples is not None and report is not None:
            self._samples.after_step(self.model, self.run, report.step)
        if report is not None and loop_faults:  # the loop's own faults, told with the step
            report = dataclasses.replace(report, events=[*loop_faults, *report.events])
        return report

    @property
    def samples(self) -> torch.Tensor | None:
        """The last samples made by `sample_fn` (at most 8, on the host), or None."""
        return self._samples.last if self._samples is not None else None

    def _step(self, loss: Any, batch: Any, data_ids: Any,
              metrics: Mapping[str, float] | None) -> StepReport | None:
        calm, measured = self.run.calm, None
        if calm is not None and calm.may_take(loss, batch, metrics):
            taken = calm.take(loss, batch)
            if isinstance(taken, StepReport):
                self.optimizer.step()
                if self.scheduler is not None:
                    self.scheduler.step()
                calm.settle()
                return taken
            measured = taken  # not calm: the full check goes on from its measurement
        if self.scaler is not None:
            self._unscale()
        ctx = self.run.before_update(loss, batch=batch, data_ids=data_ids,
                                     metrics=_step_metrics(metrics), premeasured=measured)
        if ctx.unguarded is not None:  # the check failed: the step goes ahead unguarded
            self._optimizer_step()
            if self.scheduler is not None:
                self.scheduler.step()
            return StepReport(step=ctx.step, loss=None, grad_norm=float("nan"),
                              action="applied", events=list(ctx.events))
        device = ctx.on_device
        if device is not None and device.dropped:  # a rollback undid the weights of its gradients
            return self.run.after_update(ctx)
        if device is not None:  # sync="deferred": the device decided the skip
            if device.found_inf is None:  # observe without a GradScaler: every update goes ahead
                self.optimizer.step()
            else:
                with skip_on_device(self.optimizer, device.found_inf):
                    self.optimizer.step()
            if self.scaler is not None:
                self.scaler.update()  # on the device: lowers the scale after an overflow
            return self.run.after_update(ctx)
        if ctx.applied:
            self.optimizer.step()
            if self.scaler is not None:
                self.scaler.update()
            if self.scheduler is not None:
                self.scheduler.step()
        elif self.scaler is not None and ctx.outcome != "rolled_back":
            self.scaler.update()  # lowers the scale after an overflow, as scaler.step would
            if self.config.policy == "observe" and self.scheduler is not None:
                self.scheduler.step()  # the plain loop steps its schedule past the scaler's skip
        report = self.run.after_update(ctx)
        assert report is not None
        return report

    def rollback(self, reason: str = "rollback requested by the training loop", *,
                 to_step: int | None = None) -> Event:
        """Roll back now (between steps) to the newest good state taken at or before `to_step`
        (default: the newest), with the same LR backoff and clipping as an automatic rollback.
        Only under the `recover` policy."""
        return self.run.rollback(reason, to_step=to_step)

    def observe_eval(self, metrics: Mapping[str, Any], step: int | None = None) -> list[Event]:
        """Hand evaluation metrics to trainguard (`{"accuracy": 0.81, "eval_loss": 0.52}`), at
        `step` (default: the last step taken). They are stored and shown, and judged by
        `metric_collapse`: accuracy at chance after it was above it (give
        `GuardConfig(probes={"num_classes": ...})`, or it is read from the model's output width), an
        eval loss rising while the train loss falls, a metric off a cliff. Returns the events."""
        return self.run.observe_eval(metrics, step)

    def check_batch(self, batch: Any) -> list[Finding]:
        """Inspect a batch *before* the forward pass; raise BatchError for one the model cannot
        take (token ids beyond the embedding table), with a clear message instead of an obscure
        index error or device-side assert deep inside the model."""
        return self.run.check_batch(batch)

    def prove(self, batch: Any = None) -> Proof:
        """Prove causes now, between steps: replay the next update from the state as it is on
        `batch` (default: the last healthy step's) once as it is and once per candidate fix
        (LR x0.1, a warm-up ramp, another precision, the batch without its flagged samples or
        the previous batch, LoRA alpha/r 2, an over-scaled layer re-drawn, clipping), the likely
        causes first, within `prove.budget_steps` steps' time. A cause whose fix heals a bad
        step is confirmed, one whose fix does not is ruled out; `diagnose()` ranks by it. The
        model, optimizer, gradients and RNG are put back exactly. Needs `replay_fn`."""
        if self.run.closed:
            raise UsageError("this Guard is closed")
        self.run.calm_handed_over()
        start = self._outside.since_last_step()
        self._stale.pause()  # the replays' backward passes are the Guard's own
        self._eval_mode.pause()  # and their forwards
        try:
            return self.run.prover.prove_now(self.run.state, self.run.services, batch)
        finally:  # the replays' optimizer steps are the Guard's own, not the loop's
            self._outside.discount(self._outside.since_last_step() - start)
            self._eval_mode.step_ended()

    def diagnose(self) -> list[RankedCause]:
        """Ranked likely causes of what went wrong so far. When nothing did, the configuration
        risks the audit found (flagged "no symptom detected", at most 50% confidence); empty for
        a healthy run with a sane configuration."""
        return self.run.diagnose()

    def close(self, status: Status | None = None) -> None:
        """Flush the last measurements, store the diagnosis and close the run store. The run's
        status is `status` if given; else, closed in a `finally:` (or `except:`) clause while
        an exception is under way, `interrupted` (Ctrl-C, a signal) or `crashed` (any other
        error), its type stored; `finished` otherwise."""
        self._outside.close()
        self._stale.close()
        self._eval_mode.close()
        self.run.close(status)

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._outside.close()
        self._stale.close()
        self._eval_mode.close()
        # the block's own exception, not one an enclosing `except:` clause is handling
        self.run.close(status=exit_status(exc), error=exc)

    def state_dict(self) -> dict[str, Any]:
        """The Guard's own state (baselines, counters, recovery's skip list and LR backoff), for
        checkpoints of long jobs. The good states themselves are not included."""
        return self.run.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run.load_state_dict(state)

    def checkpoint_health(self, path: str | os.PathLike[str] | None = None
                          ) -> CheckpointHealth | None:
        """The run's health for a checkpoint: the step, healthy / inside an incident / after a
        rollback, whether every weight and optimizer moment is finite (checked on the device),
        the open events and the verdict so far. Given the `path` of a checkpoint just saved (a
        file or a folder), it also writes the checkpoint's `trainguard.json` sidecar and the
        Guard's state beside it, as `trainguard.mark_checkpoint(path, guard)` does (None when
        that write failed: logged, training goes on)."""
        from trainguard.checkpoint_health import current_health, mark_checkpoint

        self.run.flush()  # a deferred run's last step is judged before its health is told
        if path is None:
            return current_health(self.run)
        return mark_checkpoint(path, self.run)

    # -- internals -------------------------------------------------------------------------------
    def _optimizer_step(self) -> None:
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()

    def _unscale(self) -> None:
        from torch.amp.grad_scaler import OptState

        assert self.scaler is not None
        state = self.scaler._per_optimizer_states[id(self.optimizer)]
        if state["stage"] is OptState.READY:
            self.scaler.unscale_(self.optimizer)


def _check_scheduler(scheduler: Any) -> None:
    """The Guard steps the scheduler once per optimizer step, with no argument: a scheduler
    whose `step` needs one (`ReduceLROnPlateau` wants the validation metric) is the loop's to
    step, and is refused here rather than failing inside the first `guard.step`."""
    if scheduler is None:
        return
    step = getattr(scheduler, "step", None)
    name = type(scheduler).__name__
    if not callable(step):
        raise UsageError(f"scheduler must have a step() method, got {name}")
    try:
        required = [p.name for p in inspect.signature(step).parameters.values()
                    if p.default is inspect.Parameter.empty
                    and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):  # a builtin without a signature: stepped as given
        return
    if required:
        raise UsageError(
            f"{name}.step() needs {', '.join(required)}: the Guard steps its scheduler once per "
            f"optimizer step with no argument. Leave scheduler=None and call "
            f"scheduler.step({required[0]}) in your loop where you have it")


def _step_metrics(metrics: Mapping[str, Any] | None) -> dict[str, float | torch.Tensor]:
    """A loop's step metrics: numbers as host floats, one-value tensors kept on their device (they
    ride the step's one transfer, `pipeline/measure.py`: never an `.item()` each); other values
    are not metrics."""
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise UsageError(f"metrics must be a mapping of names to numbers, got "
                         f"{type(metrics).__name__}")
    kept: dict[str, float | torch.Tensor] = {}
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            kept[str(key)] = float(value)
        elif isinstance(value, torch.Tensor) and value.numel() == 1:
            kept[str(key)] = value.detach().reshape(())
    return kept


def _trained(model: torch.nn.Module,
             optimizer: torch.optim.Optimizer) -> list[tuple[str, torch.nn.Parameter]]:
    """The model's parameters the optimizer trains, with their names."""
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return [(name, p) for name, p in model.named_parameters() if id(p) in stepped]
