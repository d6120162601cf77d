"""The calm lane: the usual step of a healthy run, checked in a few operations.

Most steps of a run are calm: the loss and the gradient norms are finite and near their levels,
no probe is due, nothing is clipped, and the full check (`pipeline/steps.py`) ends in "applied"
after some hundreds of microseconds of host Python, most of what the Guard adds to a small
model's step. The lane measures what that check measures first (the loss and every gradient's
norm, in the step's one transfer) and, when each value is inside the bounds the detectors set at
the run's last full step (`Detector.calm_bounds`: finite, halfway on a log scale to a spike or an
explosion, under the clip limit in force, no LR rise), takes the update at once and keeps the
step as a row.

The rows reach the detectors together at the next full step, or between two steps once
`MAX_ROWS` are kept (or when the run is read, saved or closed): `Detector.skip_calm` moves a
detector's state past its calm rows with array operations, exactly as `check` row by row would,
and `check` runs on the others (`detect.calm.run_rows`), so every detector sees every step, in
order; the run's verdict then hears each row. (The sinks hear each step's report when it is
taken.) What a detector raises on a row (a slow divergence, a rise short of the bounds) is told
at the next full step with its own step, and that step's decision reads it, as it reads the
heavy probes' events of the step before; rows handed over between steps that raise nothing
open the lane again at once.

A few detectors are checked at each step the lane takes instead (`Detector.live_in_lane`), each
first asked whether the step is calm for it (`calm_at`): the precursor, which schedules its
probes (a step they measure is taken too when their values are far from their bounds), and those
that count steps towards a verdict (a divergence's patience, the stall's judgement).

Plans made when the lane opens spare most steps even those calls, each exact against `check`:
the precursor's steps that its probes skip are tested with one product, those where they measure
log Z alone with one comparison more, and handed to it in one go
(`InstabilityPrecursor.skipped_steps`), `loss_divergence`'s levels are followed so that it judges
the rows with the others unless a step could count towards a divergence
(`LossDivergence.calm_plan`), and the adaptive clip's limit is bounded from below for
`CLIP_HORIZON` steps, its norms heard later (`ClipChain.lowest_in_force`, `ClipChain.catch_up`).
The usual step is measured in four operator calls (`_measure_plain`).

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
from trainguard.detect.instability_precursor import InstabilityPrecursor, SkippedSteps
from trainguard.detect.loss_divergence import LanePlan, LossDivergence
from trainguard.detect.lr_at_zero import LRAtZero
from trainguard.diagnose.batch import batch_elements_of
from trainguard.events import Event, StepReport, marks_trouble
from trainguard.pipeline.context import Measured
from trainguard.pipeline.measure import absent_from, loss_tensor, pack_precursors, precursors_of
from trainguard.pipeline.services import Services
from trainguard.pipeline.settle import schedule_sampling
from trainguard.pipeline.state import RunState
from trainguard.pipeline.steps import StepPipeline
from trainguard.probes.packing import DevicePack
from trainguard.remedies.clip import EPS as CLIP_EPS
from trainguard.remedies.limit import ClipLimits
from trainguard.signals import StepSignals
from trainguard.transfer import to_host

log = logging.getLogger("trainguard")

MAX_ROWS = 64
"""The most rows kept before they are handed over, between two steps: what a detector raises on
a calm row is told at most this many steps late (at the next step, which takes the full check)."""
CLIP_HORIZON = 12
"""The steps a plan of the clip (`CalmLane.clip_bound`) holds for before it is made again: a
quarter of the adaptive clip's window of 50 norms, whose median those steps can move by as
many places."""
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
    zero_lr: LRAtZero | None = None
    """`lr_at_zero`, when on duty: a step whose LRs it counts goes to the full check."""
    limit: float | None = None
    """The clip limit in force at the step the lane took last (None: none)."""
    detectors: list[Detector] = field(default_factory=list)
    """The detectors that judge the lane's rows when they are handed over (those on duty for a
    plain step, in the run's order), the live ones aside."""
    live: list[Detector] = field(default_factory=list)
    """The detectors checked at each step the lane takes (`Detector.live_in_lane`: the
    precursor, which decides when its probes measure next; a divergence's patience, the stall's
    judgement), each asked first whether the step is calm for it (`Detector.calm_at`)."""
    precursor: InstabilityPrecursor | None = None
    """The live precursor, whose steps its probes skip the lane tests in one product
    (`skipped`) and hands over in one go."""
    skipped: SkippedSteps | None = None
    """The precursor's plan for the steps its probes skip, and the steps taken on it (None: it
    is asked at each step, as the other live detectors are)."""
    clip_bound: float | None = None
    """The clip's plan: a limit under every one in force for the next `clip_left` steps; a
    step whose norm is under it reads no limit (None: each step reads its own)."""
    clip_left: int = 0
    clip_pending: list[float] = field(default_factory=list)
    """The norms of the steps taken on the plan, which the clip chain has not heard yet."""
    planned: bool = False
    """The last step taken was on the clip's plan."""
    divergent: LossDivergence | None = None
    """The `loss_divergence` detector whose plan `divergence` is."""
    divergence: LanePlan | None = None
    """`loss_divergence`'s plan (`LossDivergence.calm_plan`): while the lane's steps keep it,
    the detector judges them when they are handed over, not at each step. None: it is live."""
    live_others: list[Detector] = field(default_factory=list)
    """`live` without the precursor: those checked at a step it skips under its plan."""
    raised: list[Event] = field(default_factory=list)
    """What the live detectors raised at the steps the lane took (nothing, unless `calm_at` was
    wrong), told with the rows."""
    held: list[Event] = field(default_factory=list)
    """What the detectors raised on rows handed over after `MAX_ROWS` of them, kept for the
    next full step, whose decision reads them (`hand_over` returns them first)."""
    silent: np.ndarray | None = None
    """Which parameters' gradient norms were zero (no gradient, or an all-zero one) at the last
    full step: a step takes the lane only with the same ones silent (parameters frozen but in
    the optimizer stay so; one that wakes or falls silent is a full step's). None: not known."""
    any_silent: bool = False
    """Whether `silent` names any parameter (read once, not at every step)."""
    plain: list[torch.Tensor] | None = None
    """The watched parameters when `_measure_plain` can measure them (one device, no float16
    or float64 among them; under one process), set at `reopen`; None: the general measure."""

    # -- a step in the lane ------------------------------------------------------------------------
    def may_take(self, loss: Any, batch: Any, metrics: Any) -> bool:
        """Whether this step may try the lane (flags only: nothing is measured yet)."""
        state = self.state
        attention = self.services.attention_probe
        return (self.bounds is not None and loss is not None and not metrics
                and not state.sampled_now and not self.steps.queued
                and (attention is None or not attention.attached)
                and (state.brake is None or not state.brake.active)
                and (batch is None or not self.services.config.probes.inspect_batches
                     or (not state.batches.following and state.batches.usual_size(batch)))
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
                for lr, before in zip(lrs, self.lrs, strict=True)) or self._idle(lrs):
            return None
        loss_t = loss_tensor(loss)
        if loss_t is None:
            return None
        signals, grads, limits = self._measure(loss, loss_t, lrs, batch)
        bound = self.clip_bound
        if limits is None and not (bound is not None and _unclipped(signals.grad_norm, bound)):
            limits = self._clip_exact(signals)
        value, norm, limit = signals.loss, signals.grad_norm, signals.clip_limit
        if self.divergence is not None and not (value is not None
                                                and self.divergence.admits(value)):
            self._divergence_live()
        skipped, live, peak, logz = self.skipped, self.live, None, None
        if skipped is not None and signals.precursors:
            logz = skipped.logz_row(signals.precursors)
            if logz is None:  # the precursor measures more: it hears the steps taken first
                self._stand()
                skipped = None
        if skipped is not None:  # a step the precursor skips, or log Z alone and quiet
            live = self.live_others
        calm = (value is not None and value <= bounds.loss  # NaN fails too
                and 0.0 < norm <= bounds.grad_norm and (limit is None or _unclipped(norm, limit))
                and self._same_silent(signals.param_grad_norm))
        if calm and skipped is not None:
            quiet, peak = skipped.quiet(signals.param_grad_norm)
            if not quiet:  # nearer its bound than the plan holds: the precursor is asked
                self._stand()
                skipped, live, peak = None, self.live, None
        calm = calm and all(detector.calm_at(signals) for detector in live)
        signals.loss_curvature = state.curvature.observe(value)
        if not calm:
            if limits is None:
                limits = self._clip_exact(signals)
            return Measured(signals=signals, grads=grads, limits=limits)
        # the step is the lane's: what the full check leaves on a calm step
        state.data_position += 1
        if batch is not None:
            state.batches.saw_usual(batch)
        if skipped is not None:
            assert value is not None and self.precursor is not None  # calm: a finite loss
            skipped.keep(value, peak, None if logz is None else (
                self.precursor.measured_at(state.step), *logz))
        for detector in live:  # nothing, as `calm_at` said
            self.raised.extend(detector.take_calm(signals))
        if self.precursor is not None and signals.precursors and skipped is None:
            self.skipped = self.precursor.skipped_steps()  # its plan after a measurement
        state.prover.see_calm(signals, batch)
        if services.step_rng is not None:  # a proof of a later step keeps its own forward's
            services.step_rng.take()
        report = StepReport(step=state.step, loss=value, grad_norm=norm, action="applied",
                            lr=signals.lr, loss_curvature=signals.loss_curvature,
                            signals=signals)
        self.rows.append(Row(signals, report))
        self.lrs, self.limit = lrs, limit  # type: ignore[assignment]
        self.planned = limits is None
        return report

    def _limits(self) -> ClipLimits | None:
        """The clip limits of this step, read where `measure` reads them; None under the clip's
        plan (`clip_bound`), whose horizon a step past it renews first."""
        state = self.state
        if self.clip_bound is not None and self.clip_left <= 0:
            self._clip_plan()
        if self.clip_bound is not None:
            self.clip_left -= 1
            return None
        return state.clip.limits(state.step)

    def _clip_plan(self) -> None:
        """The clip chain brought up to date with the steps taken on the plan so far, and a
        new plan from there: a limit under every one the chain can hold for the next
        `CLIP_HORIZON` steps that apply a norm under it (`ClipChain.lowest_in_force`); a step
        under it needs no limit of its own, and the chain hears its norm later
        (`ClipChain.catch_up`)."""
        state = self.state
        state.clip.catch_up(self.clip_pending)
        self.clip_pending = []
        self.clip_bound = state.clip.lowest_in_force(state.step, CLIP_HORIZON)
        self.clip_left = CLIP_HORIZON

    def _clip_exact(self, signals: StepSignals) -> ClipLimits:
        """A step past the clip's plan: the chain brought up to date, and the step's limits
        read as `measure` reads them (the plan is over until the lane opens again)."""
        state = self.state
        state.clip.catch_up(self.clip_pending)
        self.clip_pending, self.clip_bound = [], None
        limits = state.clip.limits(state.step)
        signals.clip_limit = limits.in_force()
        return limits

    def _divergence_live(self) -> None:
        """A step outside `loss_divergence`'s plan: the detector judges the steps taken on the
        plan now, and each step from here, as the other live detectors do."""
        divergent = self.divergent
        assert divergent is not None
        self.divergent, self.divergence = None, None
        self.detectors.remove(divergent)
        self.live = [*self.live, divergent]
        self.live_others = [*self.live_others, divergent]
        if self.rows:
            self.raised.extend(_judged(divergent, self.rows,
                                       _columns([row.signals for row in self.rows])))

    def _stand(self) -> None:
        """The steps the lane took while the precursor probes skipped them, handed to the
        precursor (before it measures, hands rows over or plans again)."""
        if self.skipped is not None and self.precursor is not None:
            self.precursor.stand(self.skipped)

    def _same_silent(self, norms: np.ndarray) -> bool:
        """The step's zero gradient norms are those of the last full step (a NaN is not zero)."""
        silent = self.silent
        if silent is None or norms.shape != silent.shape:
            return False
        if not self.any_silent:  # the usual run: every gradient there, none zero
            return bool(norms.all())
        return bool(np.array_equal(norms == 0.0, silent))

    def _measure(self, loss: Any, loss_t: torch.Tensor, lrs: tuple[Any, ...], batch: Any
                 ) -> tuple[StepSignals, list[torch.Tensor], ClipLimits | None]:
        """What `measure` measures on a step with nothing sampled, followed or handed over:
        the loss, the gradient norms and the precursor probes' values when due, in one
        transfer (the loss curvature is left to the caller)."""
        state, services = self.state, self.services
        due = services.config.detectors.instability_precursor.probe and state.precursors_due
        if self.plain is not None:
            measured = self._measure_plain(self.plain, loss, loss_t, lrs, batch, logz_due=due,
                                           ratio_due=due and state.ratio_due)
            if measured is not None:
                return measured
        pack = DevicePack(services.device)
        pack.add("loss", loss_t)
        present, grads, grad_norms, _ = services.watch.grad_probe.measure(pack, services.device)
        pack_precursors(pack, services, grad_norms, due=due, ratio=state.ratio_due)
        host = pack.fetch()
        limits = self._limits()
        signals = StepSignals(
            step=state.step, loss=float(host["loss"][0]), grad_norm=float(host["grad_norm"][0]),
            param_grad_norm=host["param_grad_norm"], param_names=services.watched.names,
            lr=lrs[0], group_lrs=lrs,
            loss_requires_grad=loss.requires_grad if isinstance(loss, torch.Tensor) else None,
            batch_elements=None if batch is None else batch_elements_of(batch),
            fp16_grad_maxabs=(float(host["fp16_grad_maxabs"][0]) if "fp16_grad_maxabs" in host
                              else None),
            clip_limit=None if limits is None else limits.in_force(),
            grads_absent=absent_from(present, len(services.watched)),
            precursors=precursors_of(host, services.logz_probe))
        return signals, grads, limits

    def _measure_plain(self, params: list[torch.Tensor], loss: Any, loss_t: torch.Tensor,
                       lrs: tuple[Any, ...], batch: Any, *, logz_due: bool, ratio_due: bool
                       ) -> tuple[StepSignals, list[torch.Tensor], ClipLimits | None] | None:
        """`_measure` on the usual step of a one-device model whose every gradient is there
        and none float16 or float64: the same values from four operator calls (the fused norm,
        its stack, the global norm, a stack with the loss for the one transfer; a fifth joins
        the precursor probes' values when due: Adam's ratio, from the norms, and log Z's) and
        none of the pack's bookkeeping. None: a gradient is missing."""
        grads: list[torch.Tensor] = [p.grad for p in params]  # type: ignore[misc]
        try:  # (a missing one is a None, which the fused norm refuses)
            norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
        except (TypeError, RuntimeError):  # the general measure, until the lane opens again
            self.plain = None
            return None
        per_param = torch.stack(norms)
        device = per_param.device
        if loss_t.dtype is not torch.float32 or loss_t.device != device:
            loss_t = loss_t.to(device=device, dtype=torch.float32)
        packed = torch.stack([*norms, torch.linalg.vector_norm(per_param), loss_t])
        services, state = self.services, self.state
        ratios = (services.watch.adam_probe.measure(device, per_param) if ratio_due else {})
        probe = services.logz_probe
        logz = probe.take() if probe is not None else None  # read or dropped, as packed
        logz = logz if logz_due else None
        extra = [*ratios.values(), *(() if logz is None else (logz,))]
        if extra:
            packed = torch.cat([packed, *(t.to(device=device, dtype=torch.float32)
                                          for t in extra)])
        host = to_host(packed)
        count = len(norms)
        precursors: dict[str, np.ndarray] = {}
        start = count + 2
        for key, tensor in ratios.items():  # in the order packed
            precursors[key] = host[start:start + tensor.numel()]
            start += tensor.numel()
        if logz is not None:
            assert probe is not None
            precursors.update(probe.values(host[start:]))
        limits = self._limits()
        signals = StepSignals(
            step=state.step, loss=float(host[count + 1]), grad_norm=float(host[count]),
            param_grad_norm=host[:count], param_names=services.watched.names, precursors=precursors,
            lr=lrs[0], group_lrs=lrs,
            loss_requires_grad=loss.requires_grad if isinstance(loss, torch.Tensor) else None,
            batch_elements=None if batch is None else batch_elements_of(batch),
            clip_limit=None if limits is None else limits.in_force(), grads_absent=())
        return signals, grads, limits

    def settle(self) -> None:
        """After the optimizer and scheduler steps of a step the lane took: the run moves on,
        and the sinks hear the step's report now (the run store keeps it as it keeps any)."""
        state = self.state
        row = self.rows[-1]
        state.journal.sinks.on_step(row.report)
        if self.planned:  # under the clip's plan: the chain hears it later
            self.clip_pending.append(row.signals.grad_norm)
        else:
            state.clip.update(row.signals.grad_norm, self.limit)
        self.services.watch.weight_probe.forget()
        state.consecutive_skips = 0
        state.step += 1
        schedule_sampling(state, self.services)
        if len(self.rows) >= MAX_ROWS:
            # handed over between steps: a full check of the next step would only hand them
            # over and open the lane again, unless the rows raised something, which the next
            # step's decision reads as it reads what a full step's hand-over raises
            self.held = self.hand_over()
            if not self.held:
                self.reopen(self.lrs)  # the LRs of the step taken last

    # -- the rows handed over ----------------------------------------------------------------------
    def hand_over(self) -> list[Event]:
        """Hand the rows to the detectors, then to the verdict, in step order, and close the
        lane; returns what the detectors raised on them (each with its own step)."""
        self._stand()
        self.state.clip.catch_up(self.clip_pending)
        self.clip_pending, self.clip_bound = [], None
        rows, self.rows = self.rows, []
        self.bounds = None
        raised, self.raised, self.held = [*self.held, *self.raised], [], []
        if not rows:
            return raised
        state = self.state
        columns = _columns([row.signals for row in rows])
        events: list[Event] = raised
        for detector in self.detectors:
            events.extend(_judged(detector, rows, columns))
        events.sort(key=lambda event: event.step)
        troubled = {e.step for e in events if marks_trouble(e)}
        for row in rows:
            state.losses.observe(row.report.step, row.report.loss,
                                 trouble=row.report.step in troubled)
        if events:  # the step after one that raised anything is sampled, as a full one's
            state.sample_next = True
        return events

    def _idle(self, lrs: tuple[Any, ...]) -> bool:
        """A step at LR 0 everywhere (or under 1e-12 of the highest): `lr_at_zero`'s to count
        at its step, in the full check."""
        if any(lrs):
            zero = self.zero_lr
            return zero is not None and zero.highest > 0 and zero.idle(lrs)
        return True

    def reopen_after(self, signals: StepSignals | None) -> None:
        """`reopen` at the end of a full step, whose gradients' zeros (its `signals`; None: it
        was not measured, and the lane stays closed) the lane's steps must keep."""
        norms = None if signals is None else signals.param_grad_norm
        self.silent = (norms == 0.0 if isinstance(norms, np.ndarray) and norms.ndim == 1
                       else None)
        self.any_silent = self.silent is not None and bool(self.silent.any())
        lrs = None if signals is None else tuple(signals.group_lrs or ())
        self.reopen(lrs if lrs and all(type(lr) is float for lr in lrs) else None)

    def reopen(self, lrs: tuple[float, ...] | None = None) -> None:
        """The bounds for the steps after the last full step (or after the rows were handed
        over between steps), from the detectors' state now; the lane stays closed while one of
        them holds an episode or an outlier. `lrs`: the group LRs of the step before, which the
        next step's are compared with (the scheduler has stepped since: a jump it made is the
        full check's); None: those the optimizer holds now (a lane opened before any step)."""
        state, services = self.state, self.services
        self._stand()
        on_duty = state.on_duty(_PLAIN)
        self.live = [d for d in on_duty if d.live_in_lane]
        self.detectors = [d for d in on_duty if not d.live_in_lane]
        self.zero_lr = next((d for d in on_duty if isinstance(d, LRAtZero) and d.judged), None)
        self.live_others, self.precursor, self.skipped = self.live, None, None
        self.divergent, self.divergence = None, None
        self.bounds = None
        if not _lane_possible(state, services):
            return
        groups = services.optimizer.param_groups
        if not all(type(g.get("lr")) is float for g in groups):
            return
        self.lrs = lrs if lrs is not None else tuple(g["lr"] for g in groups)
        probe = services.watch.grad_probe
        self.plain = (list(services.watched.params)
                      if probe.one_device and not probe.has_half and not probe.sparse and not any(
                          p.dtype == torch.float64 for p in services.watched.params)
                      else None)
        loss, norm = math.inf, math.inf
        for detector in self.detectors:
            limits = detector.calm_bounds()
            if limits is None:
                return
            loss, norm = min(loss, limits[0]), min(norm, limits[1])
        self.bounds = Bounds(loss=loss, grad_norm=norm)
        self._plan_detectors()
        self._clip_plan()

    def _plan_detectors(self) -> None:
        """The plans that spare the live precursor and `loss_divergence` a call at each step:
        the precursor's for the steps its probes skip (`InstabilityPrecursor.skipped_steps`),
        the divergence's levels (`LossDivergence.calm_plan`), which hands it the rows with the
        others while the steps keep it."""
        divergent = next((d for d in self.live if isinstance(d, LossDivergence)), None)
        plan = divergent.calm_plan() if divergent is not None else None
        if divergent is not None and plan is not None:
            self.divergent, self.divergence = divergent, plan
            self.live = [d for d in self.live if d is not divergent]
            self.detectors.append(divergent)
        self.precursor = next((d for d in self.live if isinstance(d, InstabilityPrecursor)),
                              None)
        self.live_others = [d for d in self.live if d is not self.precursor]
        self.skipped = (self.precursor.skipped_steps() if self.precursor is not None
                        else None)


_PLAIN = StepSignals(step=0, loss=None, grad_norm=0.0, param_grad_norm=np.zeros(0),
                     param_names=[])
"""The shape of a lane step (no trainer metrics, nothing sampled), for `RunState.on_duty`."""


def _judged(detector: Detector, rows: list[Row], columns: SignalColumns) -> list[Event]:
    """What `detector` raises on `rows` (their signals as `columns`), in step order; a detector
    that fails on them is logged and its rows are passed over (a bug must not kill the run)."""

    def fill(position: int) -> tuple[int, StepSignals]:
        return position, rows[position].signals

    try:
        return [event for _, event in run_rows(detector, columns, fill)]
    except Exception as exc:
        log.error("trainguard: detector %s failed on the steps up to %d (%s: %s); they are "
                  "skipped", detector.kind, rows[-1].signals.step, type(exc).__name__, exc)
        return []


def _unclipped(norm: float, limit: float) -> bool:
    """Whether a step of this norm is sure to be left as it is under this limit: the clip scales
    by limit / (norm + 1e-6) in float32 (`remedies/clip.py`), so a norm within a few millionths
    of the limit is one the full check decides (False for NaN)."""
    return norm * (1.0 + CLIP_EPS) + 2.0 * CLIP_EPS <= limit


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
