"""The calm lane: the usual step of a healthy run, checked in a few operations.

Most steps of a run are calm: the loss and the gradient norms are finite and near their levels,
no probe is due, nothing is clipped, and the full check (`pipeline/steps.py`) ends in "applied"
after some hundreds of microseconds of host Python, most of what the Guard adds to a small
model's step. The lane measures what that check measures first (the loss and every gradient's
norm, in the step's one transfer) and, when each value is inside the bounds the detectors set at
the run's last full step (`Detector.calm_bounds`: finite, halfway on a log scale to a spike or an
explosion, under the clip limit in force, no LR rise), takes the update at once and keeps the
step as a row.

The rows reach the detectors together at the next full step (or when the run is read, saved or
closed): `Detector.skip_calm` moves a detector's state past its calm rows with array operations,
exactly as `check` row by row would, and `check` runs on the others (`detect.calm.run_rows`), so
every detector sees every step, in order; the run's verdict then hears each row. (The sinks hear
each step's report when it is taken.) What a detector raises on a row (a slow divergence, a rise
short of the bounds) is told at that full step with its own step, and that step's decision reads
it, as it reads the heavy probes' events of the step before.

A few detectors are checked at each step the lane takes instead (`Detector.live_in_lane`), each
first asked whether the step is calm for it (`calm_at`): the precursor, which schedules its
probes (a step they measure is taken too when their values are far from their bounds), and those
that count steps towards a verdict (a divergence's patience, the stall's judgement).

A step takes the full check whenever anything else needs it: sampled
probes due, a batch finding followed, an AMP scaler, a proof anchor, a recovery, an LR brake or
a KL controller in force, several processes, the deferred mode, metrics handed to the step,
parameters added to the optimizer, a detector inside an episode or its warm-up, a short batch.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trainguard.detect.base import Detector
from trainguard.detect.calm import SignalColumns, run_rows
from trainguard.diagnose.batch import batch_elements_of
from trainguard.events import Event, StepReport, at_least
from trainguard.pipeline.context import Measured
from trainguard.pipeline.measure import absent_from, loss_tensor, pack_precursors, precursors_of
from trainguard.pipeline.services import Services
from trainguard.pipeline.settle import schedule_sampling
from trainguard.pipeline.state import RunState
from trainguard.pipeline.steps import StepPipeline
from trainguard.probes.packing import DevicePack
from trainguard.remedies.limit import ClipLimits
from trainguard.signals import StepSignals

log = logging.getLogger("trainguard")

MAX_ROWS = 64
"""The most rows kept before they are handed over: what a detector raises on a calm row is told
at most this many steps late."""
LR_RISE = 1.5
"""A group's LR above this many times its LR at the step before leaves the lane (a schedule's
step is far smaller; `lr_change` judges a rise of 3x)."""


@dataclass(slots=True)
class Bounds:
    """What a step must stay within to be taken in the lane, set at each full step."""

    loss: float
    """The highest loss."""
    grad_norm: float
    """The highest gradient norm (the clip limit in force, read at each step, too)."""


@dataclass(slots=True)
class Row:
    """One step taken in the lane."""

    signals: StepSignals
    report: StepReport


@dataclass(eq=False)
class CalmLane:
    state: RunState
    services: Services
    steps: StepPipeline
    """The run's full check (its heavy-probe results waiting for a transfer)."""
    bounds: Bounds | None = None
    """None: closed until the next full step opens it."""
    rows: list[Row] = field(default_factory=list)
    lrs: tuple[float, ...] = ()
    """The group LRs of the step before."""
    limit: float | None = None
    """The clip limit in force at the step the lane took last (None: none)."""
    detectors: list[Detector] = field(default_factory=list)
    """The detectors that judge the lane's rows when they are handed over (those on duty for a
    plain step, in the run's order), the live ones aside."""
    live: list[Detector] = field(default_factory=list)
    """The detectors checked at each step the lane takes (`Detector.live_in_lane`: the
    precursor, which decides when its probes measure next; a divergence's patience, the stall's
    judgement), each asked first whether the step is calm for it (`Detector.calm_at`)."""
    raised: list[Event] = field(default_factory=list)
    """What the live detectors raised at the steps the lane took (nothing, unless `calm_at` was
    wrong), told with the rows."""
    silent: np.ndarray | None = None
    """Which parameters' gradient norms were zero (no gradient, or an all-zero one) at the last
    full step: a step takes the lane only with the same ones silent (parameters frozen but in
    the optimizer stay so; one that wakes or falls silent is a full step's). None: not known."""
    any_silent: bool = False
    """Whether `silent` names any parameter (read once, not at every step)."""

    # -- a step in the lane ------------------------------------------------------------------------
    def may_take(self, loss: Any, batch: Any, metrics: Any) -> bool:
        """Whether this step may try the lane (flags only: nothing is measured yet)."""
        state = self.state
        attention = self.services.attention_probe
        return (self.bounds is not None and loss is not None and not metrics
                and not state.sampled_now and not self.steps.queued
                and (attention is None or not attention.attached)
                and (state.brake is None or not state.brake.active)
                and (batch is None or (not state.batches.following
                                       and state.batches.usual_size(batch)))
                and self.services.watch.unchanged())

    def take(self, loss: Any, batch: Any) -> StepReport | Measured | None:
        """Measure the step and keep it as a row when it is calm: its report (the caller then
        takes the optimizer and scheduler steps, and calls `settle`). When it is not, what was
        measured, for the full check to go on from (`StepContext.premeasured`: the step's one
        transfer is made, and its probes read, once); None when nothing was measured."""
        state, services = self.state, self.services
        bounds = self.bounds
        assert bounds is not None
        lrs = tuple(group.get("lr") for group in services.optimizer.param_groups)
        if len(lrs) != len(self.lrs) or not all(
                type(lr) is float and lr <= LR_RISE * before
                for lr, before in zip(lrs, self.lrs, strict=True)):
            return None
        loss_t = loss_tensor(loss)
        if loss_t is None:
            return None
        signals, grads, limits = self._measure(loss, loss_t, lrs, batch)
        value, norm, limit = signals.loss, signals.grad_norm, signals.clip_limit
        calm = (value is not None and value <= bounds.loss  # NaN fails too
                and 0.0 < norm <= bounds.grad_norm and (limit is None or norm <= limit)
                and self._same_silent(signals.param_grad_norm)
                and all(detector.calm_at(signals) for detector in self.live))
        signals.loss_curvature = state.curvature.observe(value)
        if not calm:
            return Measured(signals=signals, grads=grads, limits=limits)
        # the step is the lane's: what the full check leaves on a calm step
        state.data_position += 1
        if batch is not None:
            state.batches.saw_usual(batch)
        for detector in self.live:  # nothing, as `calm_at` said
            self.raised.extend(detector.take_calm(signals))
        state.prover.see_calm(signals, batch)
        if services.step_rng is not None:  # a proof of a later step keeps its own forward's
            services.step_rng.take()
        report = StepReport(step=state.step, loss=value, grad_norm=norm, action="applied",
                            lr=signals.lr, loss_curvature=signals.loss_curvature,
                            signals=signals)
        self.rows.append(Row(signals, report))
        self.lrs, self.limit = lrs, limit  # type: ignore[assignment]
        return report

    def _same_silent(self, norms: np.ndarray) -> bool:
        """The step's zero gradient norms are those of the last full step (a NaN is not zero)."""
        silent = self.silent
        if silent is None or norms.shape != silent.shape:
            return False
        if not self.any_silent:  # the usual run: every gradient there, none zero
            return bool(norms.all())
        return bool(np.array_equal(norms == 0.0, silent))

    def _measure(self, loss: Any, loss_t: torch.Tensor, lrs: tuple[Any, ...], batch: Any
                 ) -> tuple[StepSignals, list[torch.Tensor], ClipLimits]:
        """What `measure` measures on a step with nothing sampled, followed or handed over:
        the loss, the gradient norms and the precursor probes' values when due, in one
        transfer (the loss curvature is left to the caller)."""
        state, services = self.state, self.services
        pack = DevicePack(services.device)
        pack.add("loss", loss_t)
        present, grads, grad_norms, _ = services.watch.grad_probe.measure(pack, services.device)
        pack_precursors(pack, services, grad_norms, due=(
            services.config.detectors.instability_precursor.probe and state.precursors_due),
            ratio=state.ratio_due)
        host = pack.fetch()
        limits = state.clip.limits(state.step)  # read where `measure` reads them
        signals = StepSignals(
            step=state.step, loss=float(host["loss"][0]), grad_norm=float(host["grad_norm"][0]),
            param_grad_norm=host["param_grad_norm"], param_names=services.watched.names,
            lr=lrs[0], group_lrs=lrs,
            loss_requires_grad=loss.requires_grad if isinstance(loss, torch.Tensor) else None,
            batch_elements=None if batch is None else batch_elements_of(batch),
            fp16_grad_maxabs=(float(host["fp16_grad_maxabs"][0]) if "fp16_grad_maxabs" in host
                              else None),
            clip_limit=limits.in_force(), grads_absent=absent_from(present, len(services.watched)),
            precursors=precursors_of(host))
        return signals, grads, limits

    def settle(self) -> None:
        """After the optimizer and scheduler steps of a step the lane took: the run moves on,
        and the sinks hear the step's report now (the run store keeps it as it keeps any)."""
        state = self.state
        row = self.rows[-1]
        state.journal.sinks.on_step(row.report)
        state.clip.update(row.signals.grad_norm, self.limit)
        self.services.watch.weight_probe.forget()
        state.consecutive_skips = 0
        state.step += 1
        schedule_sampling(state, self.services)
        if len(self.rows) >= MAX_ROWS:
            self.bounds = None

    # -- the rows handed over ----------------------------------------------------------------------
    def hand_over(self) -> list[Event]:
        """Hand the rows to the detectors, then to the verdict, in step order, and close the
        lane; returns what the detectors raised on them (each with its own step)."""
        rows, self.rows = self.rows, []
        self.bounds = None
        raised, self.raised = self.raised, []
        if not rows:
            return raised
        state = self.state
        columns = _columns([row.signals for row in rows])

        def fill(position: int) -> tuple[int, StepSignals]:
            return position, rows[position].signals

        events: list[Event] = raised
        for detector in self.detectors:
            try:
                events.extend(event for _, event in run_rows(detector, columns, fill))
            except Exception as exc:  # a detector bug must not kill the run
                log.error("trainguard: detector %s failed on the steps up to %d (%s: %s); they "
                          "are skipped", detector.kind, rows[-1].signals.step,
                          type(exc).__name__, exc)
        events.sort(key=lambda event: event.step)
        troubled = {e.step for e in events if at_least(e.severity, "warning")}
        for row in rows:
            state.losses.observe(row.report.step, row.report.loss,
                                 trouble=row.report.step in troubled)
        if events:  # the step after one that raised anything is sampled, as a full one's
            state.sample_next = True
        return events

    def reopen_after(self, signals: StepSignals | None) -> None:
        """`reopen` at the end of a full step, whose gradients' zeros (its `signals`; None: it
        was not measured, and the lane stays closed) the lane's steps must keep."""
        norms = None if signals is None else signals.param_grad_norm
        self.silent = (norms == 0.0 if isinstance(norms, np.ndarray) and norms.ndim == 1
                       else None)
        self.any_silent = self.silent is not None and bool(self.silent.any())
        self.reopen()

    def reopen(self) -> None:
        """The bounds for the steps after the last full step (or after the rows were handed
        over between steps), from the detectors' state now; the lane stays closed while one of
        them holds an episode or an outlier."""
        state, services = self.state, self.services
        on_duty = state.on_duty(_PLAIN)
        self.live = [d for d in on_duty if d.live_in_lane]
        self.detectors = [d for d in on_duty if not d.live_in_lane]
        self.bounds = None
        if not _lane_possible(state, services):
            return
        groups = services.optimizer.param_groups
        if not all(type(g.get("lr")) is float for g in groups):
            return
        self.lrs = tuple(g["lr"] for g in groups)
        loss, norm = math.inf, math.inf
        for detector in self.detectors:
            limits = detector.calm_bounds()
            if limits is None:
                return
            loss, norm = min(loss, limits[0]), min(norm, limits[1])
        self.bounds = Bounds(loss=loss, grad_norm=norm)


_PLAIN = StepSignals(step=0, loss=None, grad_norm=0.0, param_grad_norm=np.zeros(0),
                     param_names=[])
"""The shape of a lane step (no trainer metrics, nothing sampled), for `RunState.on_duty`."""


def _lane_possible(state: RunState, services: Services) -> bool:
    """What a run must be for the lane (besides the blocking mode, which the run opens it for
    alone): one process, the full check's other duties off."""
    return (services.dist is None and services.scaler is None
            and state.recovery is None and state.anchor is None
            and state.kl_penalty is None and services.target_probe is None
            and state.journal.warmup_watch is None)


def _columns(rows: list[StepSignals]) -> SignalColumns:
    count = len(rows)
    curvature = np.array([math.nan if s.loss_curvature is None else s.loss_curvature
                          for s in rows], dtype=np.float64)
    return SignalColumns(
        step=np.fromiter((s.step for s in rows), dtype=np.int64, count=count),
        loss=np.fromiter((s.loss for s in rows), dtype=np.float64, count=count),
        has_loss=np.ones(count, dtype=bool),
        grad_norm=np.fromiter((s.grad_norm for s in rows), dtype=np.float64, count=count),
        amp_overflow=np.zeros(count, dtype=bool),
        group_lrs=np.array([s.group_lrs for s in rows], dtype=np.float64).reshape(count, -1),
        has_lr=np.ones(count, dtype=bool), loss_curvature=curvature,
        has_curvature=~np.isnan(curvature))
