"""`Run`: one guarded training run, whoever takes its optimizer steps.

It builds, from the configuration and the user's objects, what the stages use (`Services`: the
user's objects, the watched parameters, the probes) and the runtime state (`RunState`: the
detectors, the clip chain, the recover policy, the batch inspector, the journal with the sinks,
the prover), and it owns the run's life: start (preflight audit, sinks told), each step's check
and settling around `StepPipeline` (under `sync="deferred"` through its `Deferral`), a halted or
unguarded step, the events outside a step, the diagnosis, the state dict and the close. The
`Guard` and the framework callbacks are thin adapters around it.
"""

from __future__ import annotations

import hashlib
import logging
import statistics
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainguard import lifecycle
from trainguard.config import GuardConfig
from trainguard.detect import default_detectors
from trainguard.detect.lr_at_zero import LRAtZero, lr_scales_steps
from trainguard.detect.metric_collapse import MetricCollapse
from trainguard.detect.no_progress import NoProgress
from trainguard.diagnose import Finding, preflight
from trainguard.diagnose.anchor import ProofAnchor
from trainguard.diagnose.batch_watch import BatchWatch
from trainguard.diagnose.incidents import IncidentProver
from trainguard.diagnose.preflight import RunSetup
from trainguard.diagnose.ranking import rank_causes
from trainguard.diagnose.replay import LossFn
from trainguard.diagnose.warmup_watch import WarmupWatch
from trainguard.distributed import (
    AGREED_CONFIG_FIELDS_EXCLUDED,
    agree_on_start,
    describe,
    distributed_context,
)
from trainguard.errors import (
    BatchError,
    PeerLost,
    StoreUnavailable,
    TrainingDiverged,
    UsageError,
)
from trainguard.events import ActionRecord, Event, RunError, RunInfo, StepReport, at_least
from trainguard.finiteness import finite_state
from trainguard.params import WatchedParams, watched_params
from trainguard.pipeline.act import apply_rollback
from trainguard.pipeline.calm import CalmLane
from trainguard.pipeline.context import Measured, StepContext
from trainguard.pipeline.deferred import Deferral, deferral_possible
from trainguard.pipeline.detect import run_detectors
from trainguard.pipeline.journal import Journal
from trainguard.pipeline.measure import flush_pending
from trainguard.pipeline.services import build_services
from trainguard.pipeline.settle import schedule_sampling
from trainguard.pipeline.state import RunState
from trainguard.pipeline.steps import StepPipeline
from trainguard.probes.sample_cadence import SampleCadence
from trainguard.ranked_cause import RankedCause
from trainguard.recovery import Recovery, Verdict
from trainguard.recovery.brake import PrecursorBrake
from trainguard.recovery.kl_penalty import KLPenalty, check_holder, holds_beta
from trainguard.remedies.clip_chain import ClipChain
from trainguard.run_end import exit_status, run_error, under_way
from trainguard.sinks import ConsoleSink, Sink, SinkSet
from trainguard.sinks.trackers import Found, TrackerHints, find_trackers
from trainguard.snapshot import clean_stale_temps, portable
from trainguard.store import RunStore, RunStoreSink
from trainguard.verdict import LossTrack, RunVerdict
from trainguard.version import __version__
from trainguard.vocabulary import Status

log = logging.getLogger("trainguard")

SKIPPED_TO_THE_END = 10
"""Steps skipped in a row up to the run's end after which it trained nothing more (half the
verdict's window): its last losses are those of weights no step moved, and say nothing of
recovering."""


class Run:
    """`scheduler` is restored on a rollback and audited by the preflight. `rewind_schedulers`
    are the schedulers a *trainer* steps after every optimizer step, skipped or not: they are put
    back after skipped and rolled-back steps. `owns_scaler_step`: the caller runs
    `scaler.update()` itself after the checks (the Guard); a rollback then closes the scaler's
    step before restoring it. `resume`: continue the latest run recorded in `run_dir` instead of
    starting a new one there. `mid_run`: the job restarts from a checkpoint (the preflight, which
    would misread a schedule already under way, is skipped). `owns_optimizer_step`: the caller
    (the Guard) takes the optimizer step itself, so `sync="deferred"` can hand it the device's
    skip flag (`OnDevice.found_inf`) and step the scheduler when a step is known applied.
    `noise_scheduler`: a diffusion run's, whose `prediction_type` the first steps' loss is checked
    against (`probes/diffusion_target.py`). `kl_penalty`: an object whose `beta` the loss reads
    every step (a TRL trainer), raised when the KL drifts away unheld
    (`recovery/kl_penalty.py`). `total_steps`: the run's length in optimizer steps, where a
    trainer knows it (the preflight checks the scheduler against it)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                 config: GuardConfig | None = None, run_dir: str | Path | None = None,
                 sinks: Iterable[Sink] = (), scaler: Any = None, scheduler: Any = None,
                 rewind_schedulers: Iterable[Any] = (), replay_fn: LossFn | None = None,
                 owns_scaler_step: bool = False, integration: str = "", resume: bool = False,
                 mid_run: bool = False, owns_optimizer_step: bool = False,
                 trackers: TrackerHints | None = None, noise_scheduler: Any = None,
                 kl_penalty: Any = None, total_steps: int | None = None) -> None:
        config = _checked(config, model, optimizer)
        check_holder(kl_penalty)
        self.config = config
        watched = watched_params(model, [optimizer])
        dist = distributed_context(watched.params[0].device)
        self.is_main = dist is None or dist.is_main
        """Only rank 0 writes the run store and runs the sinks and the console."""
        self.run_dir = _run_dir(run_dir)
        self.halted = False
        """The Guard halted this run (a crash snapshot, `TrainingDiverged`)."""
        self.halt_step: int | None = None  # the step it halted at
        if dist is not None:  # every rank or none, before any collective
            start = agree_on_start(dist, _agreed_setup(config, watched),
                                   config.distributed.rank_timeout_s)
            dist.link.open(dist, config.distributed.collective_timeout_s, start)
            dist.link.on_lost = _on_lost(self)
        self._pending: StepContext | None = None
        """The step checked by `before_update`, waiting for `after_update`."""
        self.calm: CalmLane | None = None  # the calm lane, once opened (`open_calm_lane`)
        self._monitor_error: tuple[str, int, int, int] | None = None
        """The last monitoring failure reported: its text, its first step, how often it recurred
        since and the last step it did."""
        self.store: RunStore | None = None
        self._trackers: list[Found] = []
        """The experiment trackers found reporting (said once the run started)."""
        journal = Journal(self._open_sinks(sinks, resume, trackers))
        self.services = build_services(
            config=config, model=model, optimizer=optimizer, watched=watched, dist=dist,
            scheduler=scheduler, owns_scaler_step=owns_scaler_step, replay_fn=replay_fn,
            scaler=scaler if scaler is not None and _scaler_enabled(scaler) else None,
            run_dir=self.run_dir, rewind_schedulers=rewind_schedulers,
            noise_scheduler=noise_scheduler)
        self.state = _initial_state(config, BatchWatch(model, config.probes.batch_size),
                                    journal, distributed=dist is not None, optimizer=optimizer)
        self.closed = False
        self.verdict: RunVerdict | None = None
        self.samples_broken: tuple[int, str] | None = None
        """Set by a Guard with a `sample_fn` while its last samples were broken (the step first
        seen, how): the verdict's `broken_output`."""
        """Whether training worked (healthy, recovered, degraded), known once the run closed."""
        self._announce(integration, resume, audit := config.probes.preflight and not mid_run)
        for tracker in self._trackers:
            self.emit_action(ActionRecord(
                kind="report_to", step=self.state.step,
                message=f"reporting to {tracker.where} too (GuardConfig(sinks="
                        "{'trackers': False}) turns this off)",
                details={"tracker": tracker.tracker}))
        if audit:
            self._run_preflight(total_steps)
        if config.policy == "recover":
            self.state.recovery = Recovery(
                dist=dist, model=model, optimizers=[optimizer], scheduler=scheduler,
                scaler=self.services.scaler, config=config, sampling=self.state.cadence)
            self.state.recovery.start(self.state.step, self.state.rewind_state())
        if config.policy != "observe":  # under recover the recovery keeps its ceiling
            self.state.brake = PrecursorBrake(
                optimizer, scheduler,
                keeper=self.state.recovery.lr if self.state.recovery is not None else None)
        if config.policy == "recover" and kl_penalty is not None and holds_beta(kl_penalty):
            # a stronger penalty trades reward for staying near the reference: recover's to make
            self.state.kl_penalty = KLPenalty(kl_penalty, config.detectors.kl_blowup.ratio)
        self.steps = StepPipeline(self.state, self.services)
        self.deferral = (Deferral() if deferral_possible(config, self.services, owns_optimizer_step)
                         else None)
        """`sync="deferred"` in force (`pipeline/deferred.py`): each step is judged on the host
        at the next one (None: before its update)."""
        if (ProofAnchor.wanted(config) and self.state.recovery is None and replay_fn is not None
                and dist is None and self.deferral is None):
            # a step whose damage is older is proved from a state before the trouble
            self.state.anchor = ProofAnchor(model, optimizer, config)
            self.state.anchor.start(self.state.step)
        self.schedule_sampling()

    # -- what the stages use, by name ------------------------------------------------------------
    model = property(lambda self: self.services.model)
    optimizer = property(lambda self: self.services.optimizer)
    scheduler = property(lambda self: self.services.scheduler)
    scaler = property(lambda self: self.services.scaler)
    device = property(lambda self: self.services.device)
    dist = property(lambda self: self.services.dist)
    watched = property(lambda self: self.services.watched)
    ranks = property(lambda self: self.services.ranks)
    grad_probe = property(lambda self: self.services.watch.grad_probe)
    weight_probe = property(lambda self: self.services.watch.weight_probe)
    batches = property(lambda self: self.state.batches)
    sinks = property(lambda self: self.state.journal.sinks)
    events = property(lambda self: self.state.journal.events)
    findings = property(lambda self: self.state.journal.findings)
    prover = property(lambda self: self.state.prover)

    @property
    def metric_watch(self) -> MetricCollapse:
        """`metric_collapse` on the evaluation metrics (its state is in `RunState`)."""
        assert self.state.metric_watch is not None
        return self.state.metric_watch

    def schedule_sampling(self, after_event: bool = False, ahead: int = 0) -> None:
        schedule_sampling(self.state, self.services, after_event, ahead)

    @property
    def steps_taken(self) -> int:
        """Optimizer steps taken so far, the one a deferred run has yet to judge included."""
        return self.state.step + (self.deferral.pending if self.deferral is not None else 0)

    @property
    def deferred(self) -> bool:
        """`sync="deferred"` is in force."""
        return self.deferral is not None

    # -- one step ----------------------------------------------------------------------------------
    def before_update(self, loss: Any, *, batch: Any = None, data_ids: Any = None,
                      metrics: Mapping[str, float | torch.Tensor] | None = None,
                      premeasured: Measured | None = None) -> StepContext:
        """Check the step and act on its gradients. Call once per optimizer step, after the
        gradients are final and unscaled, before `optimizer.step()`. Raises TrainingDiverged
        when the step halts the run; `ctx.unguarded` is set when the check itself failed.
        `metrics`: the trainer's own training metrics of the step (host numbers, or one-value
        tensors read with the step's transfer). `premeasured`: the calm lane's measurement of
        the step, which was not calm."""
        if self.closed:
            self.raise_if_peer_lost()
            raise UsageError("trainguard is closed for this run; start a new one to keep training")
        state, deferral = self.state, self.deferral
        if deferral is not None:  # the step before, judged now (may halt)
            dropped = deferral.before_step(self, loss, batch, data_ids)
            if dropped is not None:
                return dropped
        if self.dist is not None:
            self.dist.link.step = state.step
        ctx = StepContext(step=state.step, loss=loss, batch=batch,
                          data_ids=state.data_position if data_ids is None else data_ids,
                          metrics=dict(metrics or {}), sampled=state.sampled_now,
                          carried=self.steps.queued, premeasured=premeasured,
                          late=self.calm.hand_over() if self.calm is not None else [])
        self.steps.queued = []
        state.data_position += 1
        self._pending = None
        failure = (self.steps.check(ctx) if deferral is None else deferral.start(self, ctx))
        if failure is not None:
            journal = self.state.journal
            if ctx.new_params is not None:  # said outside a step: record will not run
                journal.emit_action(ctx.new_params)
            journal.add_findings(ctx.findings)
            ctx.events[:] = [self.unguarded(failure)]
            ctx.unguarded = failure
            return ctx
        if deferral is not None:  # judged at the next step
            return ctx
        if ctx.outcome == "halted":
            self.halt(ctx)
        self._pending = ctx
        return ctx

    def after_update(self, ctx: StepContext | None = None) -> StepReport | None:
        """Settle and record the step checked by `before_update`; call after the optimizer step
        and the scheduler step. None when no step was pending (the check failed)."""
        if self.deferral is not None and ctx is not None and ctx.unguarded is None:
            return self.deferral.after_update(ctx)
        pending, self._pending = self._pending, None
        if ctx is not None and ctx is not pending:
            pending = None if ctx.unguarded is not None else ctx
        if pending is None or self.closed:
            return None
        report = self.steps.settle(pending)
        if self.calm is not None:
            self.calm.reopen_after(pending.signals)
        return report

    def halt(self, ctx: StepContext) -> None:
        """The step halts the run: settle and record it, close the run, raise TrainingDiverged."""
        self.halted, self.halt_step = True, ctx.step
        report = self.steps.settle(ctx)
        diagnosis = self.close(status="halted")
        threshold = self.config.recovery.halt_severity
        causes: list[Event] = ([e for e in ctx.events if at_least(e.severity, threshold)]
                               or ctx.events)
        said = "; ".join(e.message for e in causes).rstrip(".")  # a message may end its
        raise TrainingDiverged(  # sentence itself
            f"training halted at step {ctx.step}: {said}"
            + (f". Crash snapshot: {ctx.snapshot_path}" if ctx.snapshot_path else ""),
            snapshot_path=ctx.snapshot_path, events=causes, report=report,
            diagnosis=diagnosis)

    # -- outside a step --------------------------------------------------------------------------
    def emit_event(self, event: Event) -> None:
        """An event outside a step's report (a batch refused before its forward pass, a rollback
        between steps, a monitoring failure)."""
        self.state.journal.emit_event(event)

    def emit_action(self, action: ActionRecord) -> None:
        self.state.journal.emit_action(action)

    def add_findings(self, findings: list[Finding]) -> None:
        self.state.journal.add_findings(findings)

    def observe_eval(self, metrics: Mapping[str, Any], step: int | None = None) -> list[Event]:
        """Evaluation metrics of the model at `step` (default: the last step taken): stored,
        handed to the sinks, and judged by `metric_collapse`. Returns its events."""
        if not isinstance(metrics, Mapping):
            raise UsageError(f"metrics must be a mapping of names to numbers, got "
                             f"{type(metrics).__name__}")
        self.calm_handed_over()  # the steps before the evaluation first
        at = max(self.steps_taken - 1, 0) if step is None else int(step)
        numbers = {str(k): float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.sinks.on_eval(at, numbers)
        losses = self.state.losses
        train = statistics.median(losses.recent) if losses.recent else None
        try:
            events = self.metric_watch.observe(
                numbers, at, classes=self.config.probes.num_classes or self.state.output_classes,
                train_loss=train)
        except Exception as exc:  # a monitoring bug must not kill the run
            log.error("trainguard: evaluation check failed (%s: %s)", type(exc).__name__, exc)
            return []
        for event in events:
            self.emit_event(event)
        if any(at_least(e.severity, "warning") for e in events):
            losses.observe(at, None, trouble=True)
        return events

    def check_batch(self, batch: Any) -> list[Finding]:
        """Inspect a batch before the forward pass; raise BatchError (and record the event) for
        one the model cannot take."""
        findings, fatal = self.batches.fatal(batch, self.steps_taken)
        if fatal is not None:
            self.emit_event(fatal)
            raise BatchError(fatal.message)
        return findings

    def rollback(self, reason: str, *, to_step: int | None = None) -> Event:
        """Roll back between two steps (see `Guard.rollback`)."""
        recovery = self.state.recovery
        if recovery is None:
            raise UsageError("rollback needs GuardConfig(policy='recover') (it keeps good states)")
        self.flush()  # a deferred run's last step, judged before the rollback
        if not recovery.can_roll_back():
            raise UsageError("there is no good state to roll back to yet")
        step = self.state.step - 1
        onset = step + 1 if to_step is None else to_step
        event = apply_rollback(self.state, recovery.rollback(
            Verdict("rollback", reason, onset=onset), step, mid_step=False))
        self.emit_event(event)
        self.emit_action(ActionRecord(kind="rollback", step=step, message=event.message,
                                      details=dict(event.details)))
        return event

    def unguarded(self, error: Exception, *, late: bool = False) -> Event:
        """What the loop would do without trainguard: clip as configured; the step goes ahead.
        Returns the step's `monitor_error`. The same failure on step after step is recorded
        once, and once more saying how often it recurred when another failure comes or the run
        closes: not one event per step flooding the store. `late`: the judgement of a deferred
        step failed after its update was taken as the device decided (nothing left to clip; its
        scheduler step is taken, as the plain loop would)."""
        text = f"{type(error).__name__}: {error}"
        event = Event(kind="monitor_error", step=self.state.step, severity="warning",
                      message=f"trainguard could not check this step ({text}); it was applied "
                              f"unguarded")
        last = self._monitor_error
        if last is not None and last[0] == text:
            self._monitor_error = (text, last[1], last[2] + 1, self.state.step)
        else:
            self._report_repeats()
            self._monitor_error = (text, self.state.step, 0, self.state.step)
            log.error("trainguard: %s", event.message)
            self.emit_event(event)
        try:
            if late:
                if self.scheduler is not None:
                    self.scheduler.step()
            else:
                params = [p for p in self.watched.params if p.grad is not None]
                limit = self.state.clip_limit()
                if limit is not None and params:
                    torch.nn.utils.clip_grad_norm_(params, limit)
        except Exception as exc:  # the optimizer step still runs
            log.error("trainguard: %s failed too (%s: %s)",
                      "the scheduler step" if late else "clipping", type(exc).__name__, exc)
        self.state.step += 1
        if not late:  # a deferred run schedules its next sampling after the device half
            self.schedule_sampling()
        return event

    def _report_repeats(self) -> None:
        last = self._monitor_error
        if last is None or not last[2]:
            return
        text, first, repeats, until = last
        self._monitor_error = (text, until, 0, until)
        event = Event(kind="monitor_error", step=until, severity="warning",
                      message=f"the failure of step {first} ({text}) recurred on {repeats} more "
                              f"step(s), through step {until}; each was applied unguarded",
                      details={"repeats": repeats, "first_step": first})
        log.error("trainguard: %s", event.message)
        self.emit_event(event)

    def peer_lost(self, error: PeerLost) -> None:
        """A rank is gone (or the ranks fell out of step): record why and close the run as
        failed. No collective runs after this (the link refuses them)."""
        if self.closed:
            return
        self.emit_event(Event(
            kind="peer_lost", step=self.state.step, severity="error", message=str(error),
            details={"ranks": error.ranks, "rank": self.dist.rank if self.dist else 0}))
        self.close(status="failed")

    def raise_if_peer_lost(self) -> None:
        """Steps after a lost peer fail with the same error, not with "trainguard is closed"."""
        if self.dist is not None and self.dist.link.lost is not None:
            raise self.dist.link.lost

    # -- diagnosis, state, shutdown --------------------------------------------------------------
    def evidence_findings(self, step_findings: Iterable[Finding] = ()) -> list[Finding]:
        """The findings a diagnosis weighs (see `RunState.evidence_findings`)."""
        return self.state.evidence_findings(step_findings, closed=self.closed)

    def diagnose(self) -> list[RankedCause]:
        self.calm_handed_over()
        try:
            return rank_causes(self.events, self.evidence_findings(), fixes=self.services.fixes)
        except Exception as exc:  # diagnosis is best effort
            log.error("trainguard: diagnosis failed (%s: %s)", type(exc).__name__, exc)
            return []

    def flush(self) -> None:
        """Bring what the run holds back up to date, as before a checkpoint or a read of its
        events: under `sync="deferred"` the step taken last is judged now (a wait for its
        summary; it may halt the run); the steps the calm lane took are handed to the detectors
        and the sinks."""
        if self.deferral is not None and not self.closed:
            self.deferral.flush(self)
        self.calm_handed_over()

    def open_calm_lane(self) -> None:
        """Let calm steps be taken in the calm lane (`pipeline/calm.py`): the plain-loop Guard's,
        which takes the optimizer step itself; not under `sync="deferred"`."""
        if self.deferral is None:
            self.calm = CalmLane(self.state, self.services, self.steps)
            self.calm.reopen()

    def calm_handed_over(self) -> None:
        """The steps the calm lane took since the last full step, handed to the detectors and
        the sinks now (between steps: what they raise is told, and the lane stays closed until
        the next full step)."""
        calm = self.calm
        if calm is None or not (calm.rows or calm.held) or self.closed:
            return
        late = calm.hand_over()  # what rows handed over before raised comes first
        precursor = self.state.precursor()
        if precursor is not None and late:  # as `detect` tells them (`detect/aftermath.py`)
            late = precursor.aftermath.tell(late)
        for event in late:
            self.emit_event(event)
        if not late:
            calm.reopen(calm.lrs)  # the LRs of the step the lane took last

    def state_dict(self) -> dict[str, Any]:
        """The run's state between two steps (under `sync="deferred"`, with the last step
        judged first)."""
        self.flush()
        return portable(self.state.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calm_handed_over()  # the calm steps before it, told to the state it replaces
        self.state.load_state_dict(state)
        if self.state.recovery is not None:
            self.state.recovery.restart(self.state.step, self.state.rewind_state())
        if self.state.anchor is not None:
            self.state.anchor.restart(self.state.step)
        self.state.cadence.restart()
        self.schedule_sampling()
        if self.calm is not None:  # its bounds and plans were the old state's: closed until
            self.calm.hand_over()  # the next full step opens it from the loaded one

    def close(self, status: Status | None = None, *, error: BaseException | None = None
              ) -> list[RankedCause]:
        """Flush the last measurements, tell the sinks the diagnosis and the final status, and
        close them. Returns the diagnosis. `error`: the exception that ends the run (a `with`
        block's, a trainer's); `status` None: the status it gives (`run_end.exit_status`), and
        without `error`, the one the exception under way gives (a close in a `finally:` clause
        after Ctrl-C is `interrupted`, after an error `crashed`; with none, `finished`)."""
        if self.closed:
            return []
        if status is None:
            error = error if error is not None else under_way()
            status = exit_status(error)
        with lifecycle.closing():  # a signal meanwhile waits: no run is left half closed
            return self._close(status, run_error(error))

    def _close(self, status: Status, error: RunError | None = None) -> list[RankedCause]:
        lost = self.dist is not None and self.dist.link.lost is not None
        if self.deferral is not None and not lost:  # the last step, judged before the end
            self.deferral.close(self)
            if self.halted:
                status = "halted"
        self.closed = True
        self._report_repeats()
        if self._lifecycle is not None:
            lifecycle.untrack(self._lifecycle)
        for probe in (self.services.activation_probe, self.services.output_probe,
                      self.services.attention_probe, self.services.target_probe):
            if probe is not None and probe.attached:
                probe.detach()
        self.services.watch.adam_probe.close()
        if self.services.logz_probe is not None:
            self.services.logz_probe.close()
        if self.services.step_rng is not None:
            self.services.step_rng.close()
        if self.calm is not None:  # the calm steps first, in step order
            for event in self.calm.hand_over():
                self.emit_event(event)
        try:
            self._flush_pending()
        except Exception as exc:  # the last sampled statistics are lost, nothing else
            log.error("trainguard: could not flush the last measurements (%s: %s)",
                      type(exc).__name__, exc)
        self.add_findings(self.batches.run_findings())
        self.state.journal.settle_warmup()
        diagnosis = self.diagnose()
        if diagnosis:
            self.sinks.on_diagnosis(diagnosis)
        try:
            self.verdict = self.state.losses.verdict(
                halted=self.halted or status == "halted", halt_step=self.halt_step,
                weights_finite=self._weights_finite(), untrained=self._untrained(),
                stall_reason=self._stall_reason(), broken_output=self.samples_broken,
                unjudged=self.unjudged())
        except Exception as exc:  # the verdict is advisory
            log.error("trainguard: no verdict (%s: %s)", type(exc).__name__, exc)
        if self.verdict is not None:
            self.sinks.on_verdict(self.verdict)
        if error is not None:
            self.sinks.on_run_error(error)
        self.sinks.on_run_end(status)
        self.sinks.close()
        return diagnosis

    # -- internals -------------------------------------------------------------------------------
    def unjudged(self) -> str:
        """Why the loss's level says nothing of training, when the loss's graph showed it
        (`diagnose/double_activation.py`'s `nll_input` on raw scores); "" otherwise."""
        if any(f.check == "nll_input" and f.evidence.get("input") == "scores"
               for f in self.findings):
            return ("it is nll_loss of raw scores (-z[y]), which falls without bound whatever "
                    "the model learns (finding nll_input)")
        return ""

    def _untrained(self) -> tuple[int, str] | None:
        """The first step of the longest stretch that lasted to the end over which nothing was
        learned (a detector's, `Detector.untrained`, or steps the Guard skipped, none applied),
        and what it was; None: the last steps trained."""
        found = [(self.state.step - streak, why) for detector in self.state.detectors
                 if (said := detector.untrained()) is not None for streak, why in (said,)]
        skips = self.state.consecutive_skips
        if skips >= SKIPPED_TO_THE_END:
            found.append((self.state.step - skips, "every step skipped (none applied)"))
        return min(found, default=None)

    def _stall_reason(self) -> str:
        """What the stall detector found the run showed of why it did not learn ("" when it
        judged no stall)."""
        return next((d.reason for d in self.state.detectors if isinstance(d, NoProgress)), "")

    def _weights_finite(self) -> bool | None:
        """Whether this rank's watched weights are all finite at the end (one fused pass, one
        host read, once per run); None when there are none or no loss was seen."""
        if not self.watched.params or not self.state.losses.start:
            return None
        try:
            return finite_state(self.watched.params, None)[0]
        except Exception as exc:  # the check is advisory: the verdict stands without it
            log.warning("trainguard: could not check the final weights (%s: %s)",
                        type(exc).__name__, exc)
            return None

    def _open_sinks(self, sinks: Iterable[Sink], resume: bool,
                    trackers: TrackerHints | None) -> SinkSet:
        """Only rank 0 speaks and records: the console, the run store, the user's sinks, the
        experiment trackers the run already reports to."""
        if not self.is_main:
            return SinkSet([])
        config, chosen, sinks = self.config, list[Sink](), list(sinks)
        if config.sinks.trackers:
            try:
                self._trackers = find_trackers(sinks, trackers)
            except Exception as exc:  # a tracker's trouble must not stop training
                log.warning("trainguard: could not look for the run's experiment trackers "
                            "(%s: %s); training goes on without reporting to them",
                            type(exc).__name__, exc)
        if config.sinks.console:
            chosen.append(ConsoleSink())
        if self.run_dir is not None and config.sinks.store:
            try:
                store_sink = RunStoreSink(self.run_dir, resume=resume)
            except StoreUnavailable as exc:  # the README's promise: training goes on without it
                log.warning("trainguard: %s; training goes on without the run store", exc)
            else:
                chosen.append(store_sink)
                self.store = store_sink.store
        return SinkSet([*chosen, *sinks, *(tracker.sink for tracker in self._trackers)])

    def _announce(self, integration: str, resume: bool, preflight: bool) -> None:
        """Tell the sinks the run started; close it if the process ends first; clear the
        snapshot folder of the temporaries a killed process left (as large as a snapshot)."""
        services, watched = self.services, self.services.watched
        self.sinks.on_run_start(RunInfo(
            run_dir=str(self.run_dir) if self.run_dir is not None else None,
            config=self.config.to_dict(), param_names=list(watched.names),
            param_shapes=[list(p.shape) for p in watched.params],
            trainguard_version=__version__, integration=integration,
            distributed=describe(services.dist), resume=resume, preflight=preflight))
        self._lifecycle = lifecycle.track(_closer(self)) if self.is_main else None
        clean_stale_temps(services.snapshot_dir())

    def observe_loss_graph(self, loss: Any) -> None:
        """A trainer's loss, shown with its graph before the trainer detaches it: read once
        for an activation applied twice (`diagnose/double_activation.py`)."""
        self.state.journal.add_findings(self.state.journal.observe_loss(loss))

    def _run_preflight(self, total_steps: int | None) -> None:
        try:
            findings = preflight(self.model, self.optimizer, self.scheduler, scaler=self.scaler,
                                 max_grad_norm=self.state.clip_limit(), clipping_known=True,
                                 total_steps=total_steps)
        except Exception as exc:  # an audit bug must not stop training
            log.error("trainguard: preflight audit failed (%s: %s)", type(exc).__name__, exc)
            self.sinks.on_findings(list(self.findings))  # the audit's turn, told as over
            return
        # the loop may warm the LR up itself: "no warmup" waits for the LRs the steps use
        if any(f.check == "warmup" for f in findings):
            self.state.journal.warmup_watch = WarmupWatch(RunSetup(
                model=self.model, optimizers=[self.optimizer], scheduler=self.scheduler))
            findings = [f for f in findings if f.check != "warmup"]
        self.state.journal.findings.extend(findings)
        decays = [f.evidence["decay_per_step"] for f in findings
                  if f.check == "weight_decay" and "decay_per_step" in f.evidence]
        for detector in self.state.detectors:  # a stall then weighs the decay in its reason
            if isinstance(detector, NoProgress) and decays:
                detector.decay = max(decays)
        self.sinks.on_findings(list(self.findings))

    def _flush_pending(self) -> None:
        """Bring the last heavy-probe results to the host (one transfer) and record them."""
        pending, self.steps.queued = self.steps.queued, []
        signals = flush_pending(self.state, self.services, pending)
        if signals is None:
            return
        for event in run_detectors(self.state.detectors, signals, sampled_only=True):
            self.emit_event(event)
        self.sinks.on_sampled(signals.sampled)


def _closer(run: Run) -> Callable[[Status], None]:
    """Closes the run if the process ends (SIGTERM, Ctrl-C, exit) before `close()`; holds the run
    weakly, so an abandoned run can still be collected."""
    ref = weakref.ref(run)

    def close(status: Status) -> None:
        alive = ref()
        if alive is not None:
            alive.close(status=status)

    return close


def _on_lost(run: Run) -> Callable[[PeerLost], None]:
    """`Run.peer_lost`, holding the run weakly (the link lives as long as the run's context)."""
    ref = weakref.ref(run)

    def lost(error: PeerLost) -> None:
        alive = ref()
        if alive is not None:
            alive.peer_lost(error)

    return lost


def _checked(config: Any, model: Any, optimizer: Any) -> GuardConfig:
    """The configuration (the default one for None), or one clear error for a wrong argument."""
    config = config if config is not None else GuardConfig()
    if not isinstance(config, GuardConfig):
        raise UsageError(f"config must be a trainguard.GuardConfig, got {type(config).__name__}")
    if not isinstance(model, nn.Module):
        raise UsageError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(f"optimizer must be a torch.optim.Optimizer, got "
                         f"{type(optimizer).__name__}")
    lazy = next((name for name, p in model.named_parameters()
                 if isinstance(p, nn.parameter.UninitializedParameter)), None)
    if lazy is not None:  # its shape is not known until the first forward pass
        raise UsageError(f"the model's parameter {lazy} is not initialised yet (a lazy module, "
                         "nn.LazyLinear and the like): run one forward pass on a batch before "
                         "creating the Guard")
    return config


def _agreed_setup(config: GuardConfig, watched: WatchedParams) -> dict[str, Any]:
    """What every rank must share: the configuration (less what a rank may set for itself), the
    version and the watched parameters, which lay out the per-step all-reduce."""
    settings = config.to_dict()
    for dotted in AGREED_CONFIG_FIELDS_EXCLUDED:
        section, name = dotted.split(".")
        settings[section].pop(name)
    names = "\n".join(watched.names)
    return {"trainguard": __version__, "config": settings, "watched parameters": len(watched),
            "parameter names": hashlib.sha1(names.encode()).hexdigest()[:16]}


def _initial_state(config: GuardConfig, batches: BatchWatch, journal: Journal, *,
                   distributed: bool, optimizer: torch.optim.Optimizer) -> RunState:
    probes = config.probes
    detectors = default_detectors(config.detectors)
    for detector in detectors:
        if isinstance(detector, LRAtZero):  # an LR of 0 stops only the steps it scales
            detector.judged = lr_scales_steps(optimizer)
    return RunState(
        clip=ClipChain.init(config), batches=batches, journal=journal, prover=IncidentProver(),
        detectors=detectors,
        # ranks sample the same steps: their timings differ
        cadence=SampleCadence(probes.sample_every, None if distributed else probes.sample_budget),
        losses=LossTrack(stall_steps=config.detectors.no_progress.steps),
        metric_watch=MetricCollapse(config.detectors))


def _scaler_enabled(scaler: Any) -> bool:
    is_enabled = getattr(scaler, "is_enabled", None)
    return bool(is_enabled()) if callable(is_enabled) else True


def _run_dir(run_dir: object) -> Path | None:
    """The run directory, or one clear error: an empty string would write into the current
    directory, a number is no path."""
    if run_dir is None:
        return None
    if not isinstance(run_dir, (str, Path)):
        raise UsageError(f"run_dir must be a path (str or pathlib.Path) or None, got "
                         f"{type(run_dir).__name__} {run_dir!r}")
    if not str(run_dir).strip():
        raise UsageError("run_dir is empty; give a directory such as 'runs/exp1' (or None to "
                         "keep no run store)")
    return Path(run_dir)
