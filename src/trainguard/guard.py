"""`Guard`: the plain-PyTorch-loop driver of the engine.

    guard = trainguard.Guard(model, optimizer, scheduler, scaler, run_dir="runs/exp1")
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()                      # or scaler.scale(loss).backward()
        report = guard.step(loss, batch=batch)
        optimizer.zero_grad(set_to_none=True)
    guard.close()

`guard.step` replaces clip_grad_norm_ + optimizer.step() + scheduler.step() (and the scaler's
unscale_/step/update). On a skipped step the scheduler does not advance: the schedule follows the
updates that were really applied.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainguard.config import GuardConfig
from trainguard.diagnose import Finding, preflight
from trainguard.diagnose.batch import (
    BatchHistory,
    BatchStatsOnDevice,
    FieldStats,
    batch_size_of,
    describe_batch,
    inspect_batch,
)
from trainguard.diagnose.ranking import RankedCause, rank_causes
from trainguard.diagnose.replay import LossFn, replay
from trainguard.engine import Engine, Measurement
from trainguard.errors import BatchError, TrainguardError, TrainingDiverged, UsageError
from trainguard.events import Event, StepReport, at_least
from trainguard.policy import Decision
from trainguard.recovery import Recovery, Verdict
from trainguard.remedies import apply_coefficients, drop_grads, scale_grads
from trainguard.sinks import Sink
from trainguard.snapshot import build_snapshot, write_snapshot

log = logging.getLogger("trainguard")


class Guard:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None,
                 scaler: Any = None, *, config: GuardConfig | None = None,
                 run_dir: str | Path | None = None, sinks: list[Sink] | None = None,
                 replay_fn: LossFn | None = None) -> None:
        if scheduler is not None and not callable(getattr(scheduler, "step", None)):
            raise UsageError(f"scheduler must have a step() method, got {type(scheduler).__name__}")
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.replay_fn = replay_fn
        """loss_fn(model, batch) -> loss. When given, a step with an error-level event is replayed
        on the state from before its update to name the first bad module and parameter."""
        self.engine = Engine(model, [optimizer], config=config, run_dir=run_dir, scaler=scaler,
                             sinks=sinks or ())
        self.scaler = self.engine.scaler
        self.config = self.engine.config
        self._reference_batch_size: int | None = None
        self._short_steps = 0
        self._batch_history = BatchHistory()
        self._active_batch_checks: set[str] = set()
        self.findings: list[Finding] = []
        """What the preflight audit found when the Guard started (worst first)."""
        if self.config.preflight:
            self._run_preflight()
        self.recovery: Recovery | None = None
        """The `recover` policy's ring, judgement, LR backoff and skip list (None otherwise)."""
        if self.config.policy == "recover":
            self.recovery = Recovery(engine=self.engine, model=model, optimizers=[optimizer],
                                     scheduler=scheduler, scaler=self.scaler, config=self.config)
            self.recovery.start()
        self._data_position = 0

    # -- public API ------------------------------------------------------------------------------
    @property
    def events(self) -> list[Event]:
        """Every event so far, in order."""
        return self.engine.events

    @property
    def global_step(self) -> int:
        """Number of steps taken so far (the index of the next step)."""
        return self.engine.step

    @property
    def skipped_data(self) -> set[Any]:
        """Data ids that rollbacks blamed (see `trainguard.recovery.SkippingSampler`)."""
        return self.recovery.skipped_data if self.recovery is not None else set()

    def step(self, loss: Any, *, batch: Any = None, data_ids: Any = None) -> StepReport:
        """Check the gradients of this step, then apply, clip, skip, roll back or halt.

        Call after `loss.backward()` (or `scaler.scale(loss).backward()`), with the unscaled loss.
        `data_ids` names the data of this step for the `recover` policy's skip list (for example
        the dataset indices of the batch); by default it is the batch's running position.
        """
        if self.engine.closed:
            raise UsageError("this Guard is closed; create a new one to keep training")
        engine = self.engine
        if self.scaler is not None:
            self._unscale()
        if data_ids is None:
            data_ids = self._data_position
        self._data_position += 1
        batch_stats = None
        if batch is not None and self.config.inspect_batches and engine.sampled_now:
            batch_stats = self._batch_stats_on_device(batch)  # travels with the step's transfer
        extra = self.recovery.extra() if self.recovery is not None else {}
        if batch_stats is not None:
            extra["batch"] = batch_stats.tensor  # type: ignore[assignment]
        try:
            measurement = engine.measure(
                loss, lr=self.optimizer.param_groups[0].get("lr"), extra=extra or None)
            decision = engine.decide(measurement)
        except TrainguardError:
            raise
        except Exception as exc:  # a monitoring bug must not kill the run: step unguarded
            return self._unguarded_step(exc)
        fired = bool(decision.events)
        if batch is not None and self.config.inspect_batches:
            known = (batch_stats.read(measurement.extra["batch"]) if batch_stats is not None
                     else None)
            decision.events.extend(self._batch_events(batch, measurement.signals.step, fired,
                                                      known))
        if self.replay_fn is not None and batch is not None and any(
                at_least(e.severity, "error") for e in decision.events):
            self._replay(batch, decision.events)
        if self.recovery is not None:
            self._recover(measurement, decision, data_ids)
        if any(at_least(e.severity, "warning") for e in decision.events):
            self._attach_diagnosis(decision.events)
        if decision.action == "halted":
            self._halt(measurement, batch, decision)
        if decision.applies_update:
            scale_grads(measurement.grads, decision.clip_coef)
            self._apply_clip_rules(measurement, decision.clip_coef)
            engine.before_update()
            self.optimizer.step()
            if self.scaler is not None:
                self.scaler.update()
            if self.recovery is not None:
                self.recovery.step_scheduler()
            elif self.scheduler is not None:
                self.scheduler.step()
            engine.after_update(applied=True, fired=fired)
        elif decision.action == "rolled_back":
            drop_grads(engine.watched.params)
            engine.after_update(applied=False, fired=True)
        else:
            drop_grads(engine.watched.params)
            if self.scaler is not None:
                self.scaler.update()  # lowers the scale after an overflow, as scaler.step would
            engine.after_update(applied=False, fired=fired)
        report = engine.finish(measurement, decision)
        if self.recovery is not None and decision.applies_update:
            self.recovery.after_applied()
        return report

    def rollback(self, reason: str = "rollback requested by the training loop", *,
                 to_step: int | None = None) -> Event:
        """Roll back now (between steps) to the newest good state taken at or before `to_step`
        (default: the newest), with the same LR backoff and clipping as an automatic rollback.
        Only under the `recover` policy."""
        if self.recovery is None:
            raise UsageError("rollback needs GuardConfig(policy='recover') (it keeps good states)")
        if not self.recovery.can_roll_back():
            raise UsageError("there is no good state to roll back to yet")
        step = self.engine.step - 1
        onset = step + 1 if to_step is None else to_step
        event = self.recovery.rollback(Verdict("rollback", reason, onset=onset), step,
                                       mid_step=False)
        self.engine.events.append(event)
        self.engine.sinks.on_event(event)
        if self.engine.store is not None:
            self.engine.store.put_event(event)
        return event

    def diagnose(self) -> list[RankedCause]:
        """Ranked likely causes of what went wrong so far (empty for a healthy run)."""
        try:
            return rank_causes(self.engine.events, self.findings)
        except Exception as exc:  # diagnosis is best effort
            log.error("trainguard: diagnosis failed (%s: %s)", type(exc).__name__, exc)
            return []

    def _store_diagnosis(self) -> list[RankedCause]:
        diagnosis = self.diagnose()
        if diagnosis and self.engine.store is not None and not self.engine.closed:
            self.engine.store.put_meta("diagnosis", [c.to_dict() for c in diagnosis])
        return diagnosis

    def close(self) -> None:
        """Flush the last measurements, store the diagnosis and close the run store."""
        if not self.engine.closed:
            self._store_diagnosis()
        self.engine.close()

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self.engine.closed:
            self._store_diagnosis()
        if isinstance(exc, TrainingDiverged):
            status = "halted"
        elif exc is not None:
            status = "crashed"
        else:
            status = "finished"
        self.engine.close(status=status)

    def state_dict(self) -> dict[str, Any]:
        """The Guard's own state (baselines, counters, recovery's skip list and LR backoff), for
        checkpoints of long jobs. The good states themselves are not included."""
        state = self.engine.state_dict()
        state["data_position"] = self._data_position
        if self.config.clip_rule is not None:
            state["clip_rule"] = self.config.clip_rule.state_dict()
        if self.recovery is not None:
            state["recovery"] = self.recovery.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state)
        self._data_position = int(state.get("data_position", self._data_position))
        if self.config.clip_rule is not None and "clip_rule" in state:
            self.config.clip_rule.load_state_dict(state["clip_rule"])
        if self.recovery is not None and "recovery" in state:
            self.recovery.load_state_dict(state["recovery"])

    def check_batch(self, batch: Any) -> list[Finding]:
        """Inspect a batch *before* the forward pass; raise BatchError for one the model cannot
        take (token ids beyond the embedding table), with a clear message instead of an obscure
        index error or device-side assert deep inside the model."""
        findings = inspect_batch(batch, model=self.model,
                                 expected_batch_size=self.config.batch_size)
        fatal = [f for f in findings if f.check == "batch_token_ids"]
        if fatal:
            finding = fatal[0]
            event = Event(kind=finding.check, step=self.engine.step, severity="error",
                          message=f"{finding.message} Fix: {finding.fix}",
                          param=finding.evidence.get("field"),
                          details={"cause": finding.cause, **finding.evidence})
            self.engine.events.append(event)
            self.engine.sinks.on_event(event)
            if self.engine.store is not None:
                self.engine.store.put_event(event)
            raise BatchError(event.message)
        return findings

    # -- internals -------------------------------------------------------------------------------
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

    def _recover(self, measurement: Measurement, decision: Decision, data_ids: Any) -> None:
        """Let the recover policy turn the decision into a skip, a rollback or a halt."""
        recovery = self.recovery
        assert recovery is not None
        try:
            verdict = recovery.review(measurement, decision.events, decision.applies_update,
                                      data_ids)
        except Exception as exc:  # judgement is advisory; the policy's decision stands
            log.error("trainguard: recovery review failed (%s: %s)", type(exc).__name__, exc)
            return
        if verdict is None or decision.action == "halted":
            return
        step = measurement.signals.step
        if verdict.action == "skip":
            if decision.applies_update:
                decision.action, decision.clip_coef, decision.reason = "skipped", 1.0, \
                    verdict.reason
            return
        if verdict.action == "rollback" and recovery.can_roll_back():
            try:
                event = recovery.rollback(verdict, step)
            except Exception as exc:  # a failed restore leaves an unknown state: stop cleanly
                event = Event(kind="rollback_failed", step=step, severity="critical",
                              message=f"{verdict.reason}; the rollback failed "
                                      f"({type(exc).__name__}: {exc})")
                decision.action, decision.reason = "halted", "rollback failed"
                decision.events.append(event)
                return
            decision.action, decision.clip_coef, decision.reason = "rolled_back", 1.0, \
                verdict.reason
            decision.events.append(event)
            if self._console:
                print(f"trainguard: {event.message}", file=sys.stderr, flush=True)
            return
        why = verdict.reason if verdict.action == "halt" else \
            f"{verdict.reason}, and there is no good state to roll back to"
        decision.events.append(Event(kind="rollback_limit", step=step, severity="critical",
                                     message=f"{why}: recovery gives up",
                                     value=float(recovery.controller.rollbacks)))
        decision.action, decision.reason = "halted", why

    def _attach_diagnosis(self, events: list[Event]) -> None:
        """Rank causes with this step's events included; attach and print the top three."""
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
        if self._console:
            print("trainguard likely causes: " + ", ".join(
                f"{c.code} {c.confidence:.0%}" for c in ranked) + f". Fix: {ranked[0].fix}",
                file=sys.stderr, flush=True)

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
        if self._console:
            print(f"trainguard replay: {summary}", file=sys.stderr, flush=True)

    def _batch_stats_on_device(self, batch: Any) -> BatchStatsOnDevice | None:
        try:
            stats = BatchStatsOnDevice(batch)
        except Exception as exc:  # inspection is advisory
            log.error("trainguard: batch statistics failed (%s: %s)", type(exc).__name__, exc)
            return None
        return stats if stats.tensor is not None else None

    def _batch_events(self, batch: Any, step: int, fired: bool,
                      stats: list[FieldStats] | None) -> list[Event]:
        """Cheap batch-size check every step; full inspection on the first, sampled and
        anomalous steps. Each finding is reported once until it goes away."""
        events: list[Event] = []
        try:
            size = batch_size_of(batch)
            if size is not None:
                if self._reference_batch_size is None:
                    self._reference_batch_size = self.config.batch_size or size
                short = size < self._reference_batch_size
                self._short_steps = self._short_steps + 1 if short else 0
                if self._short_steps == 2:  # one short batch is an epoch's tail; two are not
                    events.append(Event(
                        kind="batch_size", step=step, severity="warning",
                        message=f"batches hold {size} samples where {self._reference_batch_size}"
                                " were configured: they are being silently truncated",
                        value=float(size), details={"cause": "batch_truncated",
                                                    "expected": self._reference_batch_size}))
            if stats is None:
                if not fired:
                    return events
                stats = describe_batch(batch)  # an anomalous step: one more transfer is worth it
            findings = inspect_batch(batch, model=self.model, history=self._batch_history,
                                     stats=stats)
            current = {f.check for f in findings}
            for finding in findings:
                if finding.check in self._active_batch_checks:
                    continue
                events.append(Event(
                    kind=finding.check, step=step, severity=finding.severity,
                    message=f"{finding.message} Fix: {finding.fix}",
                    param=finding.evidence.get("field"),
                    details={"cause": finding.cause, **finding.evidence}))
            self._active_batch_checks = current
            if not findings:
                self._batch_history.update(stats)
        except Exception as exc:  # inspection is advisory; never stop training for it
            log.error("trainguard: batch inspection failed at step %d (%s: %s)", step,
                      type(exc).__name__, exc)
        return events

    def _run_preflight(self) -> None:
        try:
            self.findings = preflight(self.model, self.optimizer, self.scheduler,
                                      scaler=self.scaler, max_grad_norm=self.config.max_grad_norm,
                                      clipping_known=True)
        except Exception as exc:  # an audit bug must not stop training
            log.error("trainguard: preflight audit failed (%s: %s)", type(exc).__name__, exc)
            return
        if self._console:
            for finding in self.findings:
                if finding.severity != "info":
                    print(f"trainguard preflight {finding}", file=sys.stderr, flush=True)
        if self.engine.store is not None:
            self.engine.store.put_meta("preflight", [f.to_dict() for f in self.findings])

    def _unguarded_step(self, error: Exception) -> StepReport:
        """What the loop would do without trainguard: clip, step, schedule. Reported, not raised."""
        engine = self.engine
        step = engine.step
        event = Event(kind="monitor_error", step=step, severity="warning",
                      message=f"trainguard could not check this step ({type(error).__name__}: "
                              f"{error}); it was applied unguarded")
        log.error("trainguard: %s", event.message)
        params = [p for p in engine.watched.params if p.grad is not None]
        if self.config.max_grad_norm is not None and params:
            torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        engine.events.append(event)
        engine.sinks.on_event(event)
        if engine.store is not None:
            engine.store.put_event(event)
        engine.step += 1
        return StepReport(step=step, loss=None, grad_norm=float("nan"), action="applied",
                          events=[event])

    def _unscale(self) -> None:
        from torch.amp.grad_scaler import OptState

        state = self.scaler._per_optimizer_states[id(self.optimizer)]
        if state["stage"] is OptState.READY:
            self.scaler.unscale_(self.optimizer)

    def _halt(self, measurement: Measurement, batch: Any, decision: Decision) -> None:
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
                config=self.config.to_dict(),
                extra={"guard": engine.state_dict()})
            written = str(write_snapshot(path, snapshot))
        except Exception as exc:  # still halt, and say why there is no snapshot
            engine.sinks.on_event(Event(kind="snapshot_failed", step=step, severity="error",
                                        message=f"could not write {path}: {exc}"))
        drop_grads(engine.watched.params)
        report = engine.finish(measurement, decision)
        diagnosis = self._store_diagnosis()
        if diagnosis and self._console:
            print("trainguard diagnosis: " + " | ".join(str(c) for c in diagnosis[:3]),
                  file=sys.stderr, flush=True)
        if engine.store is not None and written:
            engine.store.put_meta("snapshot", written)
        engine.close(status="halted")
        raise TrainingDiverged(
            f"training halted at step {step}: " + "; ".join(e.message for e in causes)
            + (f". Crash snapshot: {written}" if written else ""),
            snapshot_path=written, events=causes, report=report, diagnosis=diagnosis)

    @property
    def _console(self) -> bool:
        """Print to the console (only rank 0 does under torch.distributed)."""
        return self.config.console and self.engine.is_main

    def _snapshot_path(self, step: int) -> Path:
        base = Path(self.config.snapshot_dir) if self.config.snapshot_dir else (
            self.engine.run_dir if self.engine.run_dir is not None
            else Path("trainguard_snapshots"))
        rank = f"_rank{self.engine.dist.rank}" if self.engine.dist is not None else ""
        return base / f"crash_step{step}{rank}.pt"
