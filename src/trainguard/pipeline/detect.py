"""Stage 2, `detect`: every source of events, before anything is decided.

In order: the LRs the step uses, which decide the preflight's held `warmup` finding in the run's
first steps; the detectors on the step's signals; the first-loss check (a finding); the batch
inspector, which reads the detectors' events (a batch is inspected in full after an anomaly); what
the batch says about a non-finite step (`details["batch"]`: "finite" or "nonfinite" only when the
batch of the rank that went bad was inspected); and, under torch.distributed, the ranks' batch
findings gathered on a step of agreed trouble, the ranks named on the events, and the desync check
of the replicas' weights (collectives every rank runs at the same step). A detector that fails is
logged and left out; the step goes on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from trainguard.diagnose import Finding
from trainguard.diagnose.batch import check_loss_above_chance
from trainguard.diagnose.diffusion_target import read_target
from trainguard.diagnose.loss_bound import ceiling_of, check_first_loss
from trainguard.distributed import RankView, describe_ranks
from trainguard.errors import PeerLost
from trainguard.events import Event
from trainguard.pipeline.context import BATCH_KEY, TARGET_KEY, Detected, Measured, StepContext
from trainguard.pipeline.services import Services
from trainguard.pipeline.state import RunState
from trainguard.registry import Kind, Tag, is_rank_local, kinds_tagged
from trainguard.signals import StepSignals

if TYPE_CHECKING:
    from trainguard.detect import Detector

log = logging.getLogger("trainguard")

OUTLIER_RATIO = 3.0
"""A rank whose own loss is this many times the others' median is where a spike came from."""
AGREED_TROUBLE = (Tag.NONFINITE, Tag.JUMP, Tag.START)
"""Families of events raised from the agreed step signals (loss, gradient norms) alone: every
rank raises them alike, so a collective may depend on them."""
BatchFacts = list[dict[str, Any]]
"""Per rank: {"inspected": bool, "nonfinite": bool, "events": [batch events as dicts]}."""


def run_detectors(detectors: list[Detector], signals: StepSignals, *,
                  sampled_only: bool = False) -> list[Event]:
    events: list[Event] = []
    for detector in detectors:
        if sampled_only and not detector.reads_sampled_only:
            continue
        try:
            raised = detector.check(signals)
        except Exception as exc:  # a detector bug must not kill the run
            log.error("trainguard: detector %s failed at step %d (%s: %s); it is skipped",
                      detector.kind, signals.step, type(exc).__name__, exc)
            continue
        if raised:  # most checks raise nothing: no call to extend by an empty list
            events.extend(raised)
    return events


@dataclass(slots=True)
class _Gathering:
    """What `detect` gathers while it runs, frozen into its `Detected` at the end."""

    events: list[Event] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    fired: bool = False
    batch_inspected: bool = False
    """This step's batch was inspected in full."""
    nonfinite_input: bool = False


def detect(ctx: StepContext, state: RunState, services: Services,
           measured: Measured) -> Detected:
    found = _Gathering()
    try:
        return _detect(ctx, state, services, measured, found)
    except Exception:
        # the step is left unchecked: what was found before the failure is still the run's
        ctx.findings.extend(found.findings)
        raise


def _detect(ctx: StepContext, state: RunState, services: Services, measured: Measured,
            found: _Gathering) -> Detected:
    signals, config, ranks = measured.signals, services.config, services.ranks
    for sample in signals.sampled:  # the class count metric_collapse judges chance by
        if sample.output.get("out_classes", 0.0) >= 2:
            state.output_classes = int(sample.output["out_classes"])
    # before explain ranks causes with the findings
    found.findings.extend(state.journal.observe_lrs(signals.group_lrs))
    if ctx.sampled:
        found.findings.extend(state.journal.observe_unheld(services.model, services.watched,
                                                           ctx.step))
    if not state.journal.unreached.done and (ctx.sampled or ctx.step < 2):
        found.findings.extend(state.journal.observe_unreached(services.watched, ctx.step))
    if not state.journal.coupled_decay.done:  # the run's first steps
        found.findings.extend(state.journal.observe_coupled_decay([services.optimizer],
                                                                  ctx.step))
    found.findings.extend(state.journal.observe_loss(ctx.loss))
    found.events.extend(ctx.late)
    found.events.extend(run_detectors(state.on_duty(signals), signals))
    precursor = state.precursor()
    if precursor is not None and found.events:  # a warning during trouble is its aftermath
        found.events = precursor.aftermath.tell(found.events)
    found.fired = bool(found.events)
    batch_events: list[Event] = []
    if ctx.batch is not None and config.probes.inspect_batches:
        batch_events = _inspect_batch(ctx, state, services, measured, found)
    if TARGET_KEY in measured.extra:
        _check_diffusion_target(services, measured, found)
    if ranks is not None and signals.ranks is not None:
        facts = (_gather_batches(ctx, services, found, batch_events)
                 if config.probes.inspect_batches and _agreed_trouble(found.events) else None)
        name_ranks(found.events, signals.ranks, facts)
        if not ranks.replicas_agree(ctx.step, signals.ranks):
            _check_desync(ctx, services, found)
    elif found.events:  # a step without events has nothing to note the batch on
        note_batch(found.events, [{"inspected": found.batch_inspected,
                                   "nonfinite": found.nonfinite_input}])
    return Detected(events=found.events, findings=found.findings, fired=found.fired,
                    nonfinite_input=found.nonfinite_input)


def _inspect_batch(ctx: StepContext, state: RunState, services: Services, measured: Measured,
                   found: _Gathering) -> list[Event]:
    signals = measured.signals
    ceiling = ceiling_of(signals.precursors)
    if ctx.step == 0:
        _check_first_loss(ctx, services, found, signals.loss, ceiling)
    known = (measured.batch_stats.read(measured.extra[BATCH_KEY])
             if measured.batch_stats is not None else None)
    spike = next((e for e in found.events if e.kind == Kind.LOSS_SPIKE), None)
    seen = state.batches.look(
        ctx.batch, ctx.step, found.fired, known, loss=signals.loss,
        level=spike.details.get("baseline") if spike is not None else None,
        data_ids=ctx.data_ids, ceiling=ceiling)
    found.batch_inspected, found.nonfinite_input = seen.inspected, seen.nonfinite
    found.events.extend(seen.events)
    return seen.events


def _gather_batches(ctx: StepContext, services: Services, found: _Gathering,
                    mine: list[Event]) -> BatchFacts | None:
    """Every rank's batch facts of a troubled step, and its batch events into this step's
    events, each naming its rank, in rank order (every rank then holds the same list). They
    stay rank-local kinds: no decision reads them."""
    assert services.ranks is not None
    own = {"inspected": found.batch_inspected, "nonfinite": found.nonfinite_input,
           "events": [e.to_dict() for e in mine]}
    try:
        facts: BatchFacts = services.ranks.gather_batches(own)
    except PeerLost:  # a rank is gone: the run stops
        raise
    except Exception as exc:  # a monitoring bug must not kill the run
        log.error("trainguard: gathering the ranks' batch findings failed at step %d "
                  "(%s: %s)", ctx.step, type(exc).__name__, exc)
        return None
    ids = {id(e) for e in mine}
    found.events[:] = [e for e in found.events if id(e) not in ids]
    for rank, theirs in enumerate(facts):
        for data in theirs["events"]:
            event = Event.from_dict(data)
            event.message = f"on rank {rank}: {event.message}"
            event.details["rank"] = rank
            found.events.append(event)
    return facts


def _check_first_loss(ctx: StepContext, services: Services, found: _Gathering,
                      loss: float | None, ceiling: float | None) -> None:
    """Runtime findings, like the preflight's: evidence for a diagnosis, not events. The first
    loss against chance level, or beyond what the model's class scores allow."""
    try:
        checked = [check_loss_above_chance(loss, ctx.batch, services.model, ceiling=ceiling),
                   check_first_loss(loss, ceiling)]
    except Exception as exc:  # advisory
        log.error("trainguard: first-loss check failed (%s: %s)", type(exc).__name__, exc)
        return
    found.findings.extend(f for f in checked if f is not None)


def _check_diffusion_target(services: Services, measured: Measured, found: _Gathering) -> None:
    """The first steps' loss against the diffusion targets: once it is known which one it
    scores, the probe comes off (a finding when it is not the scheduler's)."""
    probe = services.target_probe
    if probe is None:
        return
    read = read_target(measured.signals.loss, measured.extra[TARGET_KEY].tolist(),
                       probe.prediction_type)
    if read.trained is not None:
        probe.detach()
    if read.finding is not None:
        found.findings.append(read.finding)


def _check_desync(ctx: StepContext, services: Services, found: _Gathering) -> None:
    """Do the ranks' copies of the weights still agree (from step 0, to catch replicas that
    never started equal)? Checked before the decision, so every policy can act on it."""
    assert services.ranks is not None
    try:
        events = services.ranks.check_desync(ctx.step)
    except PeerLost:  # a rank is gone: the run stops
        raise
    except Exception as exc:  # a monitoring bug must not kill the run
        log.error("trainguard: desync check failed at step %d (%s: %s)", ctx.step,
                  type(exc).__name__, exc)
        return
    found.events.extend(events)


def _agreed_trouble(events: list[Event]) -> bool:
    return any(e.kind in kinds_tagged(tag) and not is_rank_local(e.kind)
               for e in events for tag in AGREED_TROUBLE)


def name_ranks(events: list[Event], view: RankView, facts: BatchFacts | None = None) -> None:
    """Say which rank(s) a non-finite value or a spike came from: every rank reads the agreed
    signals, so without this both ranks would print "loss is nan" for a NaN on rank 1 only.
    Gradients are measured after the backward pass, when DDP's all-reduce has already averaged
    them: NaN gradients on every rank name the rank whose own loss (or batch) was non-finite, or
    say that the rank cannot be told. `facts`: every rank's batch facts, when gathered."""
    world = len(view.loss)
    bad_loss = view.ranks_where(view.loss_nonfinite)
    bad_grads = view.ranks_where(view.grad_nonfinite)
    bad_batch = [r for r, f in enumerate(facts or []) if f["nonfinite"]]
    for event in events:
        ranks: list[int] = []
        where = ""
        if event.kind == Kind.NONFINITE_LOSS and bad_loss:
            ranks = bad_loss
        elif event.kind == Kind.NONFINITE_GRAD and bad_grads and len(bad_grads) < world:
            ranks = bad_grads  # not every rank's: local gradients (shards), not reduced ones
        elif event.kind == Kind.NONFINITE_GRAD:
            event.details["after_all_reduce"] = True
            ranks = bad_loss or bad_batch
            source = "loss" if bad_loss else "batch"
            where = ("after the all-reduce, on every rank; from "
                     + " and ".join(f"rank {r}'s" for r in ranks) + f" non-finite {source}"
                     if ranks else "after the all-reduce, on every rank: which rank's own "
                     "gradients went bad first cannot be told")
        elif event.kind in (Kind.LOSS_SPIKE, Kind.LOSS_DIVERGENCE) and world > 1:
            ranks = _outlier_ranks(view.loss)
        if ranks:
            event.details["ranks"] = ranks
        if not ranks and not where:
            continue
        where = where or describe_ranks(ranks, world)
        if event.kind in (Kind.LOSS_SPIKE, Kind.LOSS_DIVERGENCE) and len(ranks) < world:
            own = ", ".join(f"rank {r} {view.loss[r]:.4g}" for r in ranks)
            event.message += f" ({where}: own loss {own})"
        else:
            event.message += f" ({where})"
    if facts is not None:
        note_batch(events, facts)


def note_batch(events: list[Event], facts: BatchFacts) -> None:
    """What the batch of the rank(s) that went bad was, on the non-finite events: "finite" or
    "nonfinite" only when it was inspected there (`details["batch"]`); nothing otherwise, so
    that the diagnosis claims no more than was seen."""
    nonfinite = kinds_tagged(Tag.NONFINITE)
    for event in events:
        if event.kind not in nonfinite:
            continue
        ranks = event.details.get("ranks") or list(range(len(facts)))
        seen = [facts[r] for r in ranks if r < len(facts)]
        if any(f["inspected"] and f["nonfinite"] for f in seen):
            event.details["batch"] = "nonfinite"
        elif seen and all(f["inspected"] for f in seen):
            event.details["batch"] = "finite"


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
