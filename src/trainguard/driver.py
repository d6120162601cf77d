"""`StepDriver`: everything trainguard does around one optimizer step, whoever takes the step.

The plain-loop `Guard` and the framework callbacks (Hugging Face Trainer, Lightning) all run the
same pipeline through this driver, so they behave alike:

    gradients final and unscaled  ->  before_step(loss, batch=...): measure (one transfer), detect,
                                      inspect the batch, replay an error, let the policy (and the
                                      recover policy's judgement) decide, diagnose; then clip the
                                      gradients (apply), drop them (skip: `optimizer.step()` then
                                      changes nothing), restore a good state (roll back), or write a
                                      crash snapshot and raise TrainingDiverged (halt)
    optimizer.step(), scheduler.step()    (the Guard or the trainer)
    after both                    ->  after_step(): rewind a scheduler the trainer stepped on a
                                      skipped step, ramp the LR backoff, record, keep good states
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn

from trainguard.config import GuardConfig
from trainguard.diagnose import Finding, preflight
from trainguard.diagnose.batch import check_loss_above_chance
from trainguard.diagnose.batch_watch import BatchWatch
from trainguard.diagnose.ranking import RankedCause, rank_causes
from trainguard.diagnose.replay import LossFn, replay
from trainguard.engine import Engine, Measurement
from trainguard.errors import BatchError, TrainguardError, TrainingDiverged, UsageError
from trainguard.events import Event, StepReport, at_least
from trainguard.policy import Decision
from trainguard.recovery import Recovery, Verdict
from trainguard.recovery.lr import set_lr
from trainguard.remedies import apply_coefficients, drop_grads, scale_grads
from trainguard.sinks import Sink
from trainguard.snapshot import build_snapshot, portable, write_snapshot

log = logging.getLogger("trainguard")


class ScheduleRewind:
    """Puts schedulers and learning rates back where they were before a skipped step (for
    trainers that step their schedulers whatever a callback decided)."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedulers: Iterable[Any]) -> None:
        self.optimizer = optimizer
        self.schedulers = [s for s in schedulers
                           if callable(getattr(s, "state_dict", None))
                           and callable(getattr(s, "load_state_dict", None))]
        self._lrs: list[Any] | None = None
        self._states: list[dict[str, Any]] = []

    def remember(self) -> None:
        """Call before the trainer steps its schedulers (only on skipped steps: a copy per call)."""
        self._lrs = [g["lr"].clone() if isinstance(g["lr"], torch.Tensor) else g["lr"]
                     for g in self.optimizer.param_groups]
        self._states = [copy.deepcopy(s.state_dict()) for s in self.schedulers]

    def restore(self) -> None:
        """Undo whatever the schedulers did since `remember` (nothing when they did not step)."""
        if self._lrs is None:
            return
        for scheduler, state in zip(self.schedulers, self._states, strict=True):
            scheduler.load_state_dict(state)
        for group, lr in zip(self.optimizer.param_groups, self._lrs, strict=False):
            set_lr(group, lr)
        self._lrs, self._states = None, []


@dataclass(slots=True)
class _Step:
    """A step checked before the optimizer step, waiting to be recorded after it."""

    measurement: Measurement
    decision: Decision
    fired: bool


class StepDriver:
    """Runs one model's optimizer steps through the engine and carries out its decisions.

    `scheduler` is restored on a rollback and audited by the preflight. `rewind_schedulers` are
    the schedulers a *trainer* steps after every optimizer step, skipped or not: they are put back
    after skipped and rolled-back steps. The plain-loop Guard steps its scheduler only on applied
    updates and passes none. `owns_scaler_step`: the caller runs `scaler.update()` itself after
    `before_step` (the Guard); a rollback then closes the scaler's step before restoring it.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                 config: GuardConfig, run_dir: str | Path | None = None,
                 sinks: Iterable[Sink] = (), scaler: Any = None, scheduler: Any = None,
                 rewind_schedulers: Iterable[Any] = (), replay_fn: LossFn | None = None,
                 owns_scaler_step: bool = False, integration: str = "",
                 resumed: bool = False) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.replay_fn = replay_fn
        self.engine = Engine(model, [optimizer], config=config, run_dir=run_dir, scaler=scaler,
                             sinks=list(sinks))
        self.config = self.engine.config
        self.scaler = self.engine.scaler
        self.owns_scaler_step = owns_scaler_step
        self.console = self.config.console and self.engine.is_main
        """Print to stderr (only rank 0 speaks under torch.distributed)."""
        self.findings: list[Finding] = []
        self.batches = BatchWatch(model, self.config.batch_size)
        self._rewind = ScheduleRewind(optimizer, [s for s in rewind_schedulers if s is not None])
        self._pending: _Step | None = None
        self._data_position = 0
        if self.engine.store is not None and integration:
            self.engine.store.put_meta("integration", integration)
        if self.config.preflight and not resumed:  # mid-run, the audit misreads the schedule
            self._run_preflight()
        self.recovery: Recovery | None = None
        """The `recover` policy's ring, judgement, LR backoff and skip list (None otherwise)."""
        if self.config.policy == "recover":
            self.recovery = Recovery(engine=self.engine, model=model, optimizers=[optimizer],
                                     scheduler=scheduler, scaler=self.scaler, config=self.config)
            self.recovery.start()

    @property
    def events(self) -> list[Event]:
        return self.engine.events

    @property
    def skipped_data(self) -> set[Any]:
        return self.recovery.skipped_data if self.recovery is not None else set()

    # -- around the optimizer step ---------------------------------------------------------------
    def before_step(self, loss: Any, *, batch: Any = None,
                    data_ids: Any = None) -> Decision | None:
        """Check the step and act on its gradients; None when the check itself failed (the step
        then goes ahead unguarded, clipped as configured, and a `monitor_error` is recorded).

        Call once per optimizer step, after gradients are final and unscaled, before
        `optimizer.step()`. Raises TrainingDiverged when the policy halts.
        """
        engine = self.engine
        if engine.closed:
            raise UsageError("trainguard is closed for this run; start a new one to keep training")
        self._pending = None
        if data_ids is None:
            data_ids = self._data_position
        self._data_position += 1
        batch_stats = None
        if batch is not None and self.config.inspect_batches and engine.sampled_now:
            batch_stats = self.batches.stats_on_device(batch)  # rides with the step's transfer
        extra = self.recovery.extra() if self.recovery is not None else {}
        if batch_stats is not None:
            extra["batch"] = batch_stats.tensor  # type: ignore[assignment]
        try:
            measurement = engine.measure(loss, lr=self.optimizer.param_groups[0].get("lr"),
                                         extra=extra or None)
            decision = engine.decide(measurement)
        except TrainguardError:
            raise
        except Exception as exc:  # a monitoring bug must not kill the run
            self._unguarded(exc)
            return None
        fired = bool(decision.events)
        self.batches.nonfinite_input = False
        if batch is not None and self.config.inspect_batches and measurement.signals.step == 0:
            self._check_first_loss(measurement.signals.loss, batch)
        if batch is not None and self.config.inspect_batches:
            known = (batch_stats.read(measurement.extra["batch"]) if batch_stats is not None
                     else None)
            spike = next((e for e in decision.events if e.kind == "loss_spike"), None)
            decision.events.extend(self.batches.events(
                batch, measurement.signals.step, fired, known, loss=measurement.signals.loss,
                level=spike.details.get("baseline") if spike is not None else None))
        if self.replay_fn is not None and batch is not None and any(
                at_least(e.severity, "error") for e in decision.events):
            self._replay(batch, decision.events)
        if self.recovery is not None:
            self._recover(measurement, decision, data_ids)
        if any(at_least(e.severity, "warning") for e in decision.events):
            self._attach_diagnosis(decision.events)
        if decision.action == "halted":
            self._halt(measurement, decision, batch)
        if decision.applies_update:
            scale_grads(measurement.grads, decision.clip_coef)
            self._apply_clip_rules(measurement, decision.clip_coef)
            engine.before_update()
        else:
            drop_grads(engine.watched.params)
            self._rewind.remember()
        self._pending = _Step(measurement, decision, fired or decision.action == "rolled_back")
        return decision

    def after_step(self) -> StepReport | None:
        """Record the step checked by `before_step`; call after the optimizer step and the
        scheduler step. Returns None when no step was pending (the check failed or did not run)."""
        pending, self._pending = self._pending, None
        if pending is None or self.engine.closed:
            return None
        applied = pending.decision.applies_update
        if applied:
            if self.recovery is not None:
                self.recovery.after_schedule()
        else:
            try:
                self._rewind.restore()
            except Exception as exc:  # the schedule drifts by a step; training goes on
                log.error("trainguard: could not rewind the LR scheduler after a skipped step "
                          "(%s: %s)", type(exc).__name__, exc)
        self.engine.after_update(applied=applied, fired=pending.fired)
        report = self.engine.finish(pending.measurement, pending.decision)
        if self.recovery is not None and applied:
            self.recovery.after_applied()
        return report

    def check_batch(self, batch: Any) -> list[Finding]:
        """Inspect a batch before the forward pass; raise BatchError (and record the event) for
        one the model cannot take."""
        findings, fatal = self.batches.fatal(batch, self.engine.step)
        if fatal is not None:
            self._record_event(fatal)
            raise BatchError(fatal.message)
        return findings

    def rollback(self, reason: str, *, to_step: int | None = None) -> Event:
        """Roll back between two steps (see `Guard.rollback`)."""
        if self.recovery is None:
            raise UsageError("rollback needs GuardConfig(policy='recover') (it keeps good states)")
        if not self.recovery.can_roll_back():
            raise UsageError("there is no good state to roll back to yet")
        step = self.engine.step - 1
        onset = step + 1 if to_step is None else to_step
        event = self.recovery.rollback(Verdict("rollback", reason, onset=onset), step,
                                       mid_step=False)
        self._record_event(event)
        return event

    # -- state, diagnosis, shutdown --------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain Python types only, so framework checkpoints load it with weights_only=True. The
        recover policy's saved states are not included (they are as large as a checkpoint)."""
        state = self.engine.state_dict()
        state["data_position"] = self._data_position
        if self.config.clip_rule is not None:
            state["clip_rule"] = self.config.clip_rule.state_dict()
        if self.recovery is not None:
            state["recovery"] = self.recovery.state_dict()
        return portable(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state)
        self._data_position = int(state.get("data_position", self._data_position))
        if self.config.clip_rule is not None and "clip_rule" in state:
            self.config.clip_rule.load_state_dict(state["clip_rule"])
        if self.recovery is not None and "recovery" in state:
            self.recovery.load_state_dict(state["recovery"])

    def diagnose(self) -> list[RankedCause]:
        try:
            return rank_causes(self.engine.events, self.findings)
        except Exception as exc:  # diagnosis is best effort
            log.error("trainguard: diagnosis failed (%s: %s)", type(exc).__name__, exc)
            return []

    def store_diagnosis(self) -> list[RankedCause]:
        diagnosis = self.diagnose()
        if diagnosis and self.engine.store is not None and not self.engine.closed:
            self.engine.store.put_meta("diagnosis", [c.to_dict() for c in diagnosis])
        return diagnosis

    def close(self, status: str = "finished") -> None:
        if self.engine.closed:
            return
        self.store_diagnosis()
        self.engine.close(status=status)

    # -- internals -------------------------------------------------------------------------------
    def _record_event(self, event: Event) -> None:
        """An event outside a step's report (a batch refused before its forward, a rollback
        between steps, a monitoring failure)."""
        engine = self.engine
        engine.events.append(event)
        engine.sinks.on_event(event)
        if engine.store is not None:
            engine.store.put_event(event)

    def _run_preflight(self) -> None:
        try:
            self.findings = preflight(self.model, self.optimizer, self.scheduler,
                                      scaler=self.scaler, max_grad_norm=self.engine.max_grad_norm,
                                      clipping_known=True)
        except Exception as exc:  # an audit bug must not stop training
            log.error("trainguard: preflight audit failed (%s: %s)", type(exc).__name__, exc)
            return
        if self.console:
            for finding in self.findings:
                if finding.severity != "info":
                    print(f"trainguard preflight {finding}", file=sys.stderr, flush=True)
        if self.engine.store is not None:
            self.engine.store.put_meta("preflight", [f.to_dict() for f in self.findings])

    def _check_first_loss(self, loss: float | None, batch: Any) -> None:
        """A runtime finding, like the preflight's: evidence for a diagnosis, not an event."""
        try:
            finding = check_loss_above_chance(loss, batch, self.model)
        except Exception as exc:  # advisory
            log.error("trainguard: first-loss check failed (%s: %s)", type(exc).__name__, exc)
            return
        if finding is None:
            return
        self.findings.append(finding)
        if self.console:
            print(f"trainguard check {finding}", file=sys.stderr, flush=True)
        if self.engine.store is not None:
            self.engine.store.put_meta("preflight", [f.to_dict() for f in self.findings])

    def _apply_clip_rules(self, measurement: Measurement, coef: float) -> None:
        """The configured extra clipping, on the norms as the global clip left them."""
        rule, agc = self.config.clip_rule, self.config.agc
        if rule is None and agc is None:
            return
        signals = measurement.signals
        try:
            if rule is not None:
                coefs = rule.coefficients(signals.param_grad_norm * coef,
                                          signals.grad_norm * coef, signals.param_names)
                apply_coefficients(self.engine.watched.params, coefs)
            if agc is not None:
                agc.apply(self.engine.watched.params, self.engine.watched.names,
                          grad_norms=signals.param_grad_norm * coef if rule is None else None)
        except Exception as exc:  # a remedy bug must not kill the run; the global clip stands
            log.error("trainguard: clipping rule failed at step %d (%s: %s)", signals.step,
                      type(exc).__name__, exc)

    def _replay(self, batch: Any, events: list[Event]) -> None:
        """The update has not been applied yet, so the model holds the state from before it."""
        try:
            report = replay(self.model, batch, self.replay_fn)  # type: ignore[arg-type]
        except Exception as exc:  # diagnosis is best effort
            log.error("trainguard: replay failed (%s: %s)", type(exc).__name__, exc)
            return
        summary = report.summary()
        run = report.first
        details = {"summary": summary, "deterministic": report.deterministic,
                   "first_nonfinite_module": run.first_nonfinite_module.module
                   if run.first_nonfinite_module else None,
                   "first_overflow_module": run.first_overflow_module.module
                   if run.first_overflow_module else None,
                   "first_nonfinite_grad": run.first_nonfinite_grad}
        for event in events:
            if at_least(event.severity, "error"):
                event.details["replay"] = details
        if self.console:
            print(f"trainguard replay: {summary}", file=sys.stderr, flush=True)

    def _recover(self, measurement: Measurement, decision: Decision, data_ids: Any) -> None:
        """Let the recover policy turn the decision into a skip, a rollback or a halt."""
        recovery = self.recovery
        assert recovery is not None
        try:
            verdict = recovery.review(measurement, decision.events, decision.applies_update,
                                      data_ids, nonfinite_input=self.batches.nonfinite_input)
        except Exception as exc:  # judgement is advisory; the policy's decision stands
            log.error("trainguard: recovery review failed (%s: %s)", type(exc).__name__, exc)
            return
        if verdict is None or decision.action == "halted":
            return
        step = measurement.signals.step
        if verdict.action == "skip":
            if decision.applies_update:
                decision.action, decision.clip_coef = "skipped", 1.0
                decision.reason = verdict.reason
            return
        if verdict.action == "rollback" and recovery.can_roll_back():
            try:
                event = recovery.rollback(verdict, step, mid_step=self.owns_scaler_step)
            except Exception as exc:  # a failed restore leaves an unknown state: stop cleanly
                decision.events.append(Event(
                    kind="rollback_failed", step=step, severity="critical",
                    message=f"{verdict.reason}; the rollback failed ({type(exc).__name__}: "
                            f"{exc})"))
                decision.action, decision.reason = "halted", "rollback failed"
                return
            decision.action, decision.clip_coef, decision.reason = "rolled_back", 1.0, \
                verdict.reason
            decision.events.append(event)
            if self.console:
                print(f"trainguard: {event.message}", file=sys.stderr, flush=True)
            return
        why = verdict.reason if verdict.action == "halt" else \
            f"{verdict.reason}, and there is no good state to roll back to"
        decision.events.append(Event(kind="rollback_limit", step=step, severity="critical",
                                     message=f"{why}: recovery gives up",
                                     value=float(recovery.controller.rollbacks)))
        decision.action, decision.reason = "halted", why

    def _attach_diagnosis(self, events: list[Event]) -> None:
        """Rank causes with this step's events included; attach them to its serious events."""
        try:
            ranked = rank_causes(self.engine.events + events, self.findings, top=3)
        except Exception as exc:  # diagnosis is best effort
            log.error("trainguard: diagnosis failed (%s: %s)", type(exc).__name__, exc)
            return
        if not ranked:
            return
        likely = [{"code": c.code, "confidence": round(c.confidence, 3)} for c in ranked]
        for event in events:
            if at_least(event.severity, "warning"):
                event.details["likely_causes"] = likely
        if self.console:
            print("trainguard likely causes: " + ", ".join(
                f"{c.code} {c.confidence:.0%}" for c in ranked) + f". Fix: {ranked[0].fix}",
                file=sys.stderr, flush=True)

    def _unguarded(self, error: Exception) -> None:
        """What the loop would do without trainguard: clip as configured; the step goes ahead."""
        engine = self.engine
        event = Event(kind="monitor_error", step=engine.step, severity="warning",
                      message=f"trainguard could not check this step ({type(error).__name__}: "
                              f"{error}); it was applied unguarded")
        log.error("trainguard: %s", event.message)
        try:
            params = [p for p in engine.watched.params if p.grad is not None]
            if engine.max_grad_norm is not None and params:
                torch.nn.utils.clip_grad_norm_(params, engine.max_grad_norm)
        except Exception as exc:  # the optimizer step still runs
            log.error("trainguard: clipping failed too (%s: %s)", type(exc).__name__, exc)
        self._record_event(event)
        engine.step += 1

    def _halt(self, measurement: Measurement, decision: Decision, batch: Any) -> NoReturn:
        """Snapshot the state from before this step's update, record, close, and raise."""
        engine = self.engine
        step = measurement.signals.step
        causes = engine.halt_events(decision)
        path = self._snapshot_path(step)
        written: str | None = None
        try:
            snapshot = build_snapshot(
                step=step, model=self.model, optimizers=[self.optimizer],
                scheduler=self.scheduler, scaler=self.scaler, batch=batch,
                events=[e.to_dict() for e in engine.events + decision.events],
                config=self.config.to_dict(), extra={"guard": engine.state_dict()})
            written = str(write_snapshot(path, snapshot))
        except Exception as exc:  # still halt, and say why there is no snapshot
            engine.sinks.on_event(Event(kind="snapshot_failed", step=step, severity="error",
                                        message=f"could not write {path}: {exc}"))
        drop_grads(engine.watched.params)  # whatever runs next, it applies nothing
        report = engine.finish(measurement, decision)
        diagnosis = self.store_diagnosis()
        if diagnosis and self.console:
            print("trainguard diagnosis: " + " | ".join(str(c) for c in diagnosis[:3]),
                  file=sys.stderr, flush=True)
        if engine.store is not None and written:
            engine.store.put_meta("snapshot", written)
        engine.close(status="halted")
        raise TrainingDiverged(
            f"training halted at step {step}: " + "; ".join(e.message for e in causes)
            + (f". Crash snapshot: {written}" if written else ""),
            snapshot_path=written, events=causes, report=report, diagnosis=diagnosis)

    def _snapshot_path(self, step: int) -> Path:
        base = Path(self.config.snapshot_dir) if self.config.snapshot_dir else (
            self.engine.run_dir if self.engine.run_dir is not None
            else Path("trainguard_snapshots"))
        rank = f"_rank{self.engine.dist.rank}" if self.engine.dist is not None else ""
        return base / f"crash_step{step}{rank}.pt"
