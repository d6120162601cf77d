"""Stage 2, `detect`: every source of events, before anything is decided.

In order: the LRs the step uses, which decide the preflight's held `warmup` finding in the run's
first steps; the detectors on the step's signals; the first-loss check (a finding); the batch
inspector, which reads the detectors' events (a batch is inspected in full after an anomaly); and,
under torch.distributed, the desync check of the replicas' weights (a collective every rank runs at
the same step). A detector that fails is logged and left out; the step goes on.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from trainguard.diagnose.batch import check_loss_above_chance
from trainguard.distributed import RankView, describe_ranks
from trainguard.events import Event
from trainguard.pipeline.context import StepContext
from trainguard.pipeline.measure import BATCH_KEY
from trainguard.signals import StepSignals

if TYPE_CHECKING:
    from trainguard.detect import Detector
    from trainguard.pipeline.run import Run

log = logging.getLogger("trainguard")

OUTLIER_RATIO = 3.0
"""A rank whose own loss is this many times the others' median is where a spike came from."""


def run_detectors(detectors: list[Detector], signals: StepSignals, *,
                  sampled_only: bool = False) -> list[Event]:
    events: list[Event] = []
    for detector in detectors:
        if sampled_only and not detector.reads_sampled_only:
            continue
        try:
            events.extend(detector.check(signals))
        except Exception as exc:  # a detector bug must not kill the run
            log.error("trainguard: detector %s failed at step %d (%s: %s); it is skipped",
                      detector.kind, signals.step, type(exc).__name__, exc)
    return events


class Detect:
    name = "detect"

    def __init__(self, run: Run) -> None:
        self.run = run

    def __call__(self, ctx: StepContext) -> None:
        run, signals = self.run, ctx.signals
        assert signals is not None
        for sample in signals.sampled:  # the class count metric_collapse judges chance by
            if sample.output.get("out_classes", 0.0) >= 2:
                run.output_classes = int(sample.output["out_classes"])
        run.observe_lrs(signals.group_lrs)  # before explain ranks causes with the findings
        for event in run_detectors(run.state.detectors, signals):
            ctx.raise_event(event)
        ctx.fired = bool(ctx.events)
        if ctx.batch is not None and run.config.inspect_batches:
            self._inspect_batch(ctx, signals)
        if run.ranks is not None and signals.ranks is not None:
            name_ranks(ctx.events, signals.ranks)
            if not run.ranks.replicas_agree(ctx.step, signals.ranks):
                self._check_desync(ctx)

    def _inspect_batch(self, ctx: StepContext, signals: StepSignals) -> None:
        run = self.run
        run.batches.nonfinite_input = False
        if ctx.step == 0:
            self._check_first_loss(ctx, signals.loss)
        known = (ctx.batch_stats.read(ctx.extra[BATCH_KEY]) if ctx.batch_stats is not None
                 else None)
        spike = next((e for e in ctx.events if e.kind == "loss_spike"), None)
        for event in run.batches.events(
                ctx.batch, ctx.step, ctx.fired, known, loss=signals.loss,
                level=spike.details.get("baseline") if spike is not None else None):
            ctx.raise_event(event)

    def _check_first_loss(self, ctx: StepContext, loss: float | None) -> None:
        """A runtime finding, like the preflight's: evidence for a diagnosis, not an event."""
        try:
            finding = check_loss_above_chance(loss, ctx.batch, self.run.model)
        except Exception as exc:  # advisory
            log.error("trainguard: first-loss check failed (%s: %s)", type(exc).__name__, exc)
            return
        if finding is not None:
            self.run.add_findings([finding])

    def _check_desync(self, ctx: StepContext) -> None:
        """Do the ranks' copies of the weights still agree (from step 0, to catch replicas that
        never started equal)? Checked before the decision, so every policy can act on it."""
        assert self.run.ranks is not None
        try:
            events = self.run.ranks.check_desync(ctx.step)
        except Exception as exc:  # a monitoring bug must not kill the run
            log.error("trainguard: desync check failed at step %d (%s: %s)", ctx.step,
                      type(exc).__name__, exc)
            return
        for event in events:
            ctx.raise_event(event)


def name_ranks(events: list[Event], view: RankView) -> None:
    """Say which rank(s) a non-finite value or a spike came from: every rank reads the agreed
    signals, so without this both ranks would print "loss is nan" for a NaN on rank 1 only."""
    world = len(view.loss)
    bad_loss = view.ranks_where(view.loss_nonfinite)
    bad_grads = view.ranks_where(view.grad_nonfinite)
    for event in events:
        ranks: list[int] = []
        if event.kind == "nonfinite_loss" and bad_loss:
            ranks = bad_loss
        elif event.kind == "nonfinite_grad":
            # DDP averages gradients, so a NaN from one rank reaches every rank's gradients:
            # the rank whose own loss was non-finite is the source when there is one
            ranks = bad_loss or bad_grads
        elif event.kind in ("loss_spike", "loss_divergence") and world > 1:
            ranks = _outlier_ranks(view.loss)
        if not ranks:
            continue
        event.details["ranks"] = ranks
        where = describe_ranks(ranks, world)
        if event.kind in ("loss_spike", "loss_divergence") and len(ranks) < world:
            own = ", ".join(f"rank {r} {view.loss[r]:.4g}" for r in ranks)
            event.message += f" ({where}: own loss {own})"
        else:
            event.message += f" ({where})"


def _outlier_ranks(losses: np.ndarray) -> list[int]:
    """Ranks whose own loss is far above the others' (a spike from one rank's batch)."""
    finite = np.isfinite(losses)
    if finite.sum() < 2:
        return []
    out = []
    for rank in np.flatnonzero(finite):
        others = np.delete(losses, rank)
        others = others[np.isfinite(others)]
        level = float(np.median(others)) if others.size else 0.0
        if level > 0 and losses[rank] > OUTLIER_RATIO * level:
            out.append(int(rank))
    return out if len(out) < finite.sum() else []
