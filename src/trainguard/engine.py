"""The engine runs one optimizer step through the pipeline.

    probes measure (on the device) -> one transfer -> signals -> detectors -> events
    -> policy chooses an action -> the driver acts -> post-step probes -> sinks record

The engine never calls `optimizer.step()` itself. A *driver* does: `Guard.step` for plain loops,
framework callbacks for trainers that own the step. A driver calls, in order,
`measure` (after gradients are final and unscaled), `decide`, then acts on the decision,
calling `before_update` / `after_update` around the optimizer step it performs (or not), and
finally `finish`, which records the step and returns the StepReport.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from trainguard import __version__
from trainguard.config import GuardConfig
from trainguard.detect import default_detectors
from trainguard.distributed import (
    LocalShardGradientProbe,
    RankAgreement,
    describe,
    distributed_context,
)
from trainguard.errors import UsageError
from trainguard.events import Action, Event, StepReport, at_least
from trainguard.params import watched_params
from trainguard.policy import Decision, choose_action
from trainguard.probes.activations import ActivationProbe
from trainguard.probes.gradients import GradientProbe
from trainguard.probes.optimizer_state import OptimizerStateProbe
from trainguard.probes.packing import DevicePack
from trainguard.probes.weights import WeightProbe
from trainguard.signals import SampledStats, StepSignals
from trainguard.sinks import ConsoleSink, Sink, SinkSet
from trainguard.store import RunStore

log = logging.getLogger("trainguard")


@dataclass(slots=True)
class Measurement:
    """What `measure` found: host signals plus the device gradients a remedy may scale."""

    signals: StepSignals
    grads: list[torch.Tensor] = field(default_factory=list)
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    """Host copies of the extra device tensors the driver asked to carry (e.g. batch stats)."""


@dataclass(slots=True)
class _Pending:
    """Device-side heavy-probe results waiting for the next transfer."""

    step: int
    per_param: dict[str, torch.Tensor] = field(default_factory=dict)
    module_names: list[str] = field(default_factory=list)
    per_module: dict[str, torch.Tensor] = field(default_factory=dict)


def loss_tensor(loss: Any) -> torch.Tensor | None:
    """Validate the loss a user passed: a scalar tensor, a number or None."""
    if loss is None:
        return None
    if isinstance(loss, torch.Tensor):
        if loss.numel() != 1:
            raise UsageError(f"the loss must be a scalar, got a tensor of shape "
                             f"{tuple(loss.shape)}: reduce it (for example loss.mean()) first")
        if not (loss.is_floating_point() or loss.is_complex()):
            loss = loss.float()
        return loss.detach().reshape(())
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return torch.tensor(float(loss))
    raise UsageError(f"the loss must be a scalar tensor or a number, got {type(loss).__name__}")


class Engine:
    def __init__(self, model: nn.Module, optimizers: list[torch.optim.Optimizer], *,
                 config: GuardConfig | None = None, run_dir: str | Path | None = None,
                 scaler: Any = None, sinks: Iterable[Sink] = ()) -> None:
        self.config = config if config is not None else GuardConfig()
        if not isinstance(self.config, GuardConfig):
            raise UsageError(f"config must be a trainguard.GuardConfig, got "
                             f"{type(self.config).__name__}")
        self.model = model
        self.optimizers = optimizers
        self.watched = watched_params(model, optimizers)
        self.device = self.watched.params[0].device
        self.scaler = scaler if scaler is not None and _scaler_enabled(scaler) else None
        self.dist = distributed_context(self.device)
        """This rank under torch.distributed (world size > 1); None for a single process."""
        self.ranks = RankAgreement(self.dist, self.watched) if self.dist is not None else None
        """One all-reduce per step and the desync check, so that every rank decides alike."""
        self.is_main = self.dist is None or self.dist.is_main
        """Only rank 0 writes the run store and runs the sinks and the console."""
        self.grad_probe = (GradientProbe(self.watched) if self.dist is None
                           else LocalShardGradientProbe(self.watched))
        self.weight_probe = WeightProbe(self.watched)
        self.optstate_probe = OptimizerStateProbe(self.watched, optimizers)
        self.activation_probe = ActivationProbe(model) if self.config.activation_probe else None
        self.detectors = default_detectors(self.config.detectors)
        self.events: list[Event] = []
        self.step = 0
        """Index of the next step (the first step is 0)."""
        self.consecutive_skips = 0
        self.max_grad_norm = self.config.max_grad_norm
        """The clipping limit in force (the recover policy tightens it after a rollback)."""
        self.closed = False
        self._pending: list[_Pending] = []
        self._sample_next = False
        self._sampled_now = False
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.store = (RunStore(self.run_dir) if self.run_dir is not None and self.config.store
                      and self.is_main else None)
        all_sinks = list(sinks) if self.is_main else []
        if self.config.console and self.is_main:
            all_sinks.insert(0, ConsoleSink())
        self.sinks = SinkSet(all_sinks)
        if self.store is not None:
            self.store.put_meta("trainguard_version", __version__)
            self.store.put_meta("config", self.config.to_dict())
            self.store.put_meta("param_names", self.watched.names)
            self.store.put_meta("param_shapes", [list(p.shape) for p in self.watched.params])
            self.store.put_meta("status", "running")
            if self.dist is not None:
                self.store.put_meta("distributed", describe(self.dist))
        self._schedule_sampling(self.step)

    # -- sampling ------------------------------------------------------------------------------
    @property
    def sampled_now(self) -> bool:
        """Whether the step about to be measured runs the heavy probes."""
        return self._sampled_now

    def is_sampled(self, step: int) -> bool:
        cfg = self.config
        return cfg.sample_all_steps or step % cfg.sample_every == 0

    def _schedule_sampling(self, step: int) -> None:
        """Decide before the forward of `step` whether it is sampled; attach hooks if so."""
        self._sampled_now = self.is_sampled(step) or self._sample_next
        self._sample_next = False
        if self._sampled_now and self.activation_probe is not None:
            self.activation_probe.attach()

    # -- 1. measure ------------------------------------------------------------------------------
    def measure(self, loss: Any, *, lr: float | torch.Tensor | None = None,
                extra: dict[str, torch.Tensor] | None = None) -> Measurement:
        """Probe the step (gradients final and unscaled) with one device-to-host transfer."""
        loss_t = loss_tensor(loss)
        # Under torch.distributed the pack all-reduces loss and gradient norms at fetch.
        pack = DevicePack(self.device) if self.ranks is None else self.ranks.step_pack(self.device)
        if loss_t is not None:
            pack.add("loss", loss_t.float())
        _, grads, _ = self.grad_probe.measure(pack, self.device)
        if isinstance(lr, torch.Tensor):
            pack.add("lr", lr)
        if self.scaler is not None and getattr(self.scaler, "_scale", None) is not None:
            pack.add("loss_scale", self.scaler._scale)
        step = self.step
        if self.activation_probe is not None and self.activation_probe.attached:
            seen = self.activation_probe.detach()
            if seen is not None:
                self._pending.append(_Pending(step=step, module_names=seen[0], per_module=seen[1]))
        pending, self._pending = self._pending, []
        _pack_pending(pack, pending)
        for key, tensor in (extra or {}).items():
            pack.add(f"x:{key}", tensor)
        host = pack.fetch()

        loss_value = float(host["loss"][0]) if "loss" in host else None
        grad_norm = float(host["grad_norm"][0])
        loss_scale = float(host["loss_scale"][0]) if "loss_scale" in host else None
        lr_value = float(host["lr"][0]) if "lr" in host else (None if lr is None else float(lr))
        loss_finite = loss_value is None or math.isfinite(loss_value)
        sampled = _unpack_pending(host, pending)
        signals = StepSignals(
            step=step, loss=loss_value, grad_norm=grad_norm,
            param_grad_norm=host["param_grad_norm"], param_names=self.watched.names,
            lr=lr_value, loss_scale=loss_scale,
            amp_overflow=self.scaler is not None and loss_finite and not math.isfinite(grad_norm),
            fp16_grad_maxabs=(float(host["fp16_grad_maxabs"][0]) if "fp16_grad_maxabs" in host
                              else None),
            sampled=sampled)
        return Measurement(signals=signals, grads=grads,
                           extra={k: host[f"x:{k}"] for k in (extra or {})})

    # -- 2. decide -------------------------------------------------------------------------------
    def decide(self, measurement: Measurement) -> Decision:
        signals = measurement.signals
        events: list[Event] = []
        for detector in self.detectors:
            try:
                events.extend(detector.check(signals))
            except Exception as exc:  # a detector bug must not kill the run
                log.error("trainguard: detector %s failed at step %d (%s: %s); it is skipped",
                          detector.kind, signals.step, type(exc).__name__, exc)
        decision = choose_action(self.config, signals, events, self.consecutive_skips,
                                 max_grad_norm=self.max_grad_norm)
        decision.events = events + decision.events
        return decision

    # -- 3. around the optimizer step ------------------------------------------------------------
    def before_update(self) -> None:
        """Call right before the optimizer step when the decision applies it."""
        if self._sampled_now:
            self.weight_probe.remember()

    def after_update(self, applied: bool, fired: bool) -> None:
        """Call after the optimizer step (or after skipping it): queue heavy post-step probes."""
        if not applied:
            self.weight_probe.forget()
        if self._sampled_now or fired:
            try:
                per_param = self.weight_probe.measure(self.device)
                per_param.update(self.optstate_probe.measure(self.device))
            except Exception as exc:  # heavy probes are optional; training goes on
                log.error("trainguard: sampled probes failed at step %d (%s: %s)", self.step,
                          type(exc).__name__, exc)
                return
            self._pending.append(_Pending(step=self.step, per_param=per_param))
        else:
            self.weight_probe.forget()

    # -- 4. record -------------------------------------------------------------------------------
    def finish(self, measurement: Measurement, decision: Decision) -> StepReport:
        signals = measurement.signals
        action: Action = decision.action
        if action == "skipped":
            self.consecutive_skips += 1
        elif action != "halted":
            self.consecutive_skips = 0
        decision.events.extend(self._check_desync(signals.step))
        report = StepReport(step=signals.step, loss=signals.loss, grad_norm=signals.grad_norm,
                            action=action, events=decision.events, lr=signals.lr,
                            loss_scale=signals.loss_scale, clip_coef=decision.clip_coef,
                            sampled=self._sampled_now)
        self._record(report, signals)
        self.step += 1
        # Under torch.distributed batch findings are rank-local; sampling must stay in step on
        # every rank (sampled statistics are agreed with collectives).
        self._sample_next = any(self.dist is None or not e.kind.startswith("batch_")
                                for e in decision.events)
        if action != "halted":
            self._schedule_sampling(self.step)
        return report

    def _check_desync(self, step: int) -> list[Event]:
        """Under torch.distributed, every `desync_every` steps (from step 0, to catch replicas
        that never started equal): do the ranks' copies of the weights still agree?"""
        if self.ranks is None or step % self.config.desync_every:
            return []
        try:
            return self.ranks.check_desync(step)
        except Exception as exc:  # a monitoring bug must not kill the run
            log.error("trainguard: desync check failed at step %d (%s: %s)", step,
                      type(exc).__name__, exc)
            return []

    def _record(self, report: StepReport, signals: StepSignals) -> None:
        self.events.extend(report.events)
        for event in report.events:
            self.sinks.on_event(event)
        if self.store is not None:
            for event in report.events:
                self.store.put_event(event)
            self._store_sampled(signals.sampled)
            scalars = {"loss": report.loss, "grad_norm": report.grad_norm, "lr": report.lr,
                       "loss_scale": report.loss_scale, "action": report.action,
                       "clip_coef": report.clip_coef, "sampled": report.sampled,
                       "amp_overflow": signals.amp_overflow,
                       "nonfinite_grads": int((~np.isfinite(signals.param_grad_norm)).sum())}
            if signals.fp16_grad_maxabs is not None:
                scalars["fp16_grad_maxabs"] = signals.fp16_grad_maxabs
            self.store.put_step(report.step, scalars, signals.param_grad_norm)
        self.sinks.on_step(report)

    def _store_sampled(self, sampled: list[SampledStats]) -> None:
        if self.store is None:
            return
        for stats in sampled:
            if stats.per_param:
                self.store.put_param_metrics(stats.step, stats.per_param)
            if stats.per_module:
                self.store.put_module_metrics(stats.step, stats.module_names, stats.per_module)

    def halt_events(self, decision: Decision) -> list[Event]:
        threshold = self.config.halt_severity
        return [e for e in decision.events if at_least(e.severity, threshold)] or decision.events

    # -- state and shutdown ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "consecutive_skips": self.consecutive_skips,
                "detectors": self.detector_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.consecutive_skips = int(state["consecutive_skips"])
        self.restore_detectors(state["detectors"])
        self._schedule_sampling(self.step)

    def detector_state(self) -> dict[str, Any]:
        return {d.kind: d.state_dict() for d in self.detectors}

    def restore_detectors(self, state: dict[str, Any]) -> None:
        """Put the detectors' baselines back (on resume, or on a rollback that forgets steps)."""
        for detector in self.detectors:
            if detector.kind in state:
                detector.load_state_dict(state[detector.kind])

    def close(self, status: str = "finished") -> None:
        if self.closed:
            return
        self.closed = True
        if self.activation_probe is not None and self.activation_probe.attached:
            self.activation_probe.detach()
        if self._pending:
            self._flush_pending()
        self.sinks.close()
        if self.store is not None:
            self.store.put_meta("status", status)
            self.store.close()

    def _flush_pending(self) -> None:
        """Bring the last heavy-probe results to the host (one transfer) and record them."""
        pack = DevicePack(self.device)
        pending, self._pending = self._pending, []
        _pack_pending(pack, pending)
        sampled = _unpack_pending(pack.fetch(), pending)
        signals = StepSignals(step=self.step, loss=None, grad_norm=0.0,
                              param_grad_norm=np.zeros(len(self.watched)),
                              param_names=self.watched.names, sampled=sampled)
        for detector in self.detectors:
            if detector.reads_sampled_only:
                for event in detector.check(signals):
                    self.events.append(event)
                    self.sinks.on_event(event)
                    if self.store is not None:
                        self.store.put_event(event)
        self._store_sampled(sampled)


def _pack_pending(pack: DevicePack, pending: list[_Pending]) -> None:
    for i, item in enumerate(pending):
        for key, tensor in item.per_param.items():
            pack.add(f"p{i}:{key}", tensor)
        for key, tensor in item.per_module.items():
            pack.add(f"m{i}:{key}", tensor)


def _unpack_pending(host: dict[str, np.ndarray], pending: list[_Pending]) -> list[SampledStats]:
    return [SampledStats(step=item.step,
                         per_param={k: host[f"p{i}:{k}"] for k in item.per_param},
                         module_names=item.module_names,
                         per_module={k: host[f"m{i}:{k}"] for k in item.per_module})
            for i, item in enumerate(pending)]


def _scaler_enabled(scaler: Any) -> bool:
    is_enabled = getattr(scaler, "is_enabled", None)
    return bool(is_enabled()) if callable(is_enabled) else True
