"""The driver the framework callbacks share: one optimizer step of a loop a trainer owns.

A framework trainer calls `optimizer.step()` and `scheduler.step()` itself. The callbacks act
around those calls through this driver, mirroring `Guard.step`:

    gradients final and unscaled   ->  before_step(loss): measure, decide, then clip the gradients
                                       (apply) or drop them (skip: `optimizer.step()` then finds no
                                       gradient and changes nothing), or snapshot and raise (halt)
    trainer: optimizer.step(), scheduler.step()
    after both                     ->  after_step(): rewind the scheduler of a skipped step, record

A step is skipped by dropping its gradients because no trainer lets a callback veto the optimizer
step. The scheduler still advances after it; rewinding it keeps the schedule on the updates that
were really applied, as the plain-loop Guard does by not stepping it.
"""

from __future__ import annotations

import copy
import logging
import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainguard.config import GuardConfig
from trainguard.diagnose import Finding, preflight
from trainguard.diagnose.ranking import RankedCause, rank_causes
from trainguard.engine import Engine, Measurement
from trainguard.errors import TrainguardError, TrainingDiverged, UsageError
from trainguard.events import Event, StepReport, at_least
from trainguard.policy import Decision
from trainguard.remedies import drop_grads, scale_grads
from trainguard.sinks import Sink
from trainguard.snapshot import build_snapshot, portable, write_snapshot

log = logging.getLogger("trainguard")


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside framework wrappers (accelerate's AcceleratedOptimizer,
    Lightning's LightningOptimizer), whose `state` and `param_groups` are the real ones."""
    for _ in range(8):  # wrappers nest at most a couple of levels; never loop forever
        inner = getattr(optimizer, "optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer) or inner is optimizer:
            break
        optimizer = inner
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(f"the trainer's optimizer must be a torch.optim.Optimizer, got "
                         f"{type(optimizer).__name__}")
    return optimizer


def callback_config(config: Any) -> GuardConfig:
    """The config given to a framework callback, validated when the callback is built."""
    if config is None:
        return GuardConfig()
    if not isinstance(config, GuardConfig):
        raise UsageError(f"config must be a trainguard.GuardConfig, got {type(config).__name__}")
    if config.policy == "recover":
        raise UsageError("the recover policy rolls the model and optimizer back to a kept good "
                         "state, which only the plain-loop trainguard.Guard can do; use "
                         "policy='protect' or 'halt' with a trainer callback")
    return config


def _set_lr(group: dict[str, Any], value: Any) -> None:
    current = group["lr"]
    if isinstance(current, torch.Tensor):  # capturable optimizers keep the LR as a tensor
        current.copy_(value)
    else:
        group["lr"] = value


class ScheduleRewind:
    """Puts schedulers and learning rates back where they were before a skipped step."""

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
            _set_lr(group, lr)
        self._lrs, self._states = None, []


def scale_learning_rate(optimizer: torch.optim.Optimizer, schedulers: Iterable[Any],
                        factor: float) -> None:
    """Multiply the learning rate by `factor` so that the change survives the next scheduler step.

    `LambdaLR` (and every closed-form scheduler) recomputes lr = base_lr * f(step) from its
    `base_lrs`, so changing `param_groups` alone is undone at the next step: scale both, and the
    `initial_lr` a resumed scheduler rebuilds its base from.
    """
    if (not isinstance(factor, (int, float)) or isinstance(factor, bool)
            or not math.isfinite(factor) or not factor > 0):
        raise UsageError(f"the learning-rate factor must be a finite number > 0, got {factor!r}")
    for group in optimizer.param_groups:
        _set_lr(group, group["lr"] * factor)
        if "initial_lr" in group:
            group["initial_lr"] = group["initial_lr"] * factor
    for scheduler in schedulers:
        if isinstance(getattr(scheduler, "base_lrs", None), list):
            scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]
        if isinstance(getattr(scheduler, "_last_lr", None), list):
            scheduler._last_lr = [lr * factor for lr in scheduler._last_lr]


@dataclass(slots=True)
class _Step:
    """A step checked before the optimizer step, waiting to be recorded after it."""

    measurement: Measurement
    decision: Decision
    fired: bool


class StepDriver:
    """Runs the optimizer steps of a framework trainer through the engine."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                 config: GuardConfig, run_dir: str | Path | None = None,
                 sinks: Iterable[Sink] = (), scaler: Any = None,
                 schedulers: Iterable[Any] = (), integration: str = "",
                 resumed: bool = False) -> None:
        self.model = model
        self.optimizer = optimizer
        self.schedulers = [s for s in schedulers if s is not None]
        self.engine = Engine(model, [optimizer], config=config, run_dir=run_dir, scaler=scaler,
                             sinks=sinks)
        self.config = self.engine.config
        self.scaler = self.engine.scaler
        self.console = self.config.console and self.engine.is_main
        """Print to stderr (only rank 0 speaks under torch.distributed)."""
        self.findings: list[Finding] = []
        self._rewind = ScheduleRewind(optimizer, self.schedulers)
        self._pending: _Step | None = None
        if self.engine.store is not None and integration:
            self.engine.store.put_meta("integration", integration)
        if self.config.preflight and not resumed:  # mid-run, the audit misreads the schedule
            self._run_preflight()

    @property
    def events(self) -> list[Event]:
        return self.engine.events

    # -- around the trainer's optimizer step ---------------------------------------------------
    def before_step(self, loss: Any, *, batch: Any = None) -> Decision | None:
        """Check the step and act on its gradients; None when the check itself failed (the
        step then goes ahead unguarded, clipped as configured, and a `monitor_error` is recorded).

        Call once per optimizer step, after gradients are final and unscaled, before the trainer
        calls `optimizer.step()`. Raises TrainingDiverged when the policy halts.
        """
        engine = self.engine
        if engine.closed:
            raise UsageError("trainguard is closed for this run; a new fit needs a new callback")
        self._pending = None
        try:
            measurement = engine.measure(loss, lr=self.optimizer.param_groups[0].get("lr"))
            decision = engine.decide(measurement)
        except TrainguardError:
            raise
        except Exception as exc:  # a monitoring bug must not kill the run
            self._unguarded(exc)
            return None
        fired = bool(decision.events)
        if any(at_least(e.severity, "warning") for e in decision.events):
            self._attach_diagnosis(decision.events)
        if decision.action == "halted":
            self._halt(measurement, decision, batch)
        if decision.applies_update:
            scale_grads(measurement.grads, decision.clip_coef)
            engine.before_update()
        else:
            drop_grads(engine.watched.params)
            self._rewind.remember()
        self._pending = _Step(measurement, decision, fired)
        return decision

    def after_step(self) -> StepReport | None:
        """Record the step checked by `before_step`; call after the trainer stepped its optimizer
        and schedulers. Returns None when no step was pending (the check failed or did not run)."""
        pending, self._pending = self._pending, None
        if pending is None or self.engine.closed:
            return None
        applied = pending.decision.applies_update
        if not applied:
            try:
                self._rewind.restore()
            except Exception as exc:  # the schedule drifts by a step; training goes on
                log.error("trainguard: could not rewind the LR scheduler after a skipped step "
                          "(%s: %s)", type(exc).__name__, exc)
        self.engine.after_update(applied=applied, fired=pending.fired)
        return self.engine.finish(pending.measurement, pending.decision)

    # -- state, diagnosis, shutdown --------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain Python types only, so framework checkpoints load it with weights_only=True."""
        return portable(self.engine.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state)

    def diagnose(self) -> list[RankedCause]:
        try:
            return rank_causes(self.engine.events, self.findings)
        except Exception as exc:  # diagnosis is best effort
            log.error("trainguard: diagnosis failed (%s: %s)", type(exc).__name__, exc)
            return []

    def close(self, status: str = "finished") -> None:
        if self.engine.closed:
            return
        self._store_diagnosis()
        self.engine.close(status=status)

    # -- internals -------------------------------------------------------------------------------
    def _run_preflight(self) -> None:
        try:
            self.findings = preflight(self.model, self.optimizer,
                                      self.schedulers[0] if self.schedulers else None,
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

    def _store_diagnosis(self) -> list[RankedCause]:
        diagnosis = self.diagnose()
        if diagnosis and self.engine.store is not None and not self.engine.closed:
            self.engine.store.put_meta("diagnosis", [c.to_dict() for c in diagnosis])
        return diagnosis

    def _unguarded(self, error: Exception) -> None:
        """What the loop would do without trainguard: clip as configured; the trainer steps."""
        engine = self.engine
        event = Event(kind="monitor_error", step=engine.step, severity="warning",
                      message=f"trainguard could not check this step ({type(error).__name__}: "
                              f"{error}); it was applied unguarded")
        log.error("trainguard: %s", event.message)
        try:
            params = [p for p in engine.watched.params if p.grad is not None]
            if engine.max_grad_norm is not None and params:
                torch.nn.utils.clip_grad_norm_(params, engine.max_grad_norm)
        except Exception as exc:  # the trainer's step still runs
            log.error("trainguard: clipping failed too (%s: %s)", type(exc).__name__, exc)
        engine.events.append(event)
        engine.sinks.on_event(event)
        if engine.store is not None:
            engine.store.put_event(event)
        engine.step += 1

    def _halt(self, measurement: Measurement, decision: Decision, batch: Any) -> None:
        """Snapshot the state from before this step's update, record, close, and raise."""
        engine = self.engine
        step = measurement.signals.step
        causes = engine.halt_events(decision)
        path = self._snapshot_path(step)
        written: str | None = None
        try:
            snapshot = build_snapshot(
                step=step, model=self.model, optimizers=[self.optimizer],
                scheduler=self.schedulers[0] if self.schedulers else None, scaler=self.scaler,
                batch=batch, events=[e.to_dict() for e in engine.events + decision.events],
                config=self.config.to_dict(), extra={"guard": engine.state_dict()})
            written = str(write_snapshot(path, snapshot))
        except Exception as exc:  # still halt, and say why there is no snapshot
            engine.sinks.on_event(Event(kind="snapshot_failed", step=step, severity="error",
                                        message=f"could not write {path}: {exc}"))
        drop_grads(engine.watched.params)  # whatever the trainer does next, it applies nothing
        report = engine.finish(measurement, decision)
        diagnosis = self._store_diagnosis()
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
        return base / f"crash_step{step}.pt"
