"""Stage 3, `explain`: why this step went wrong, before anything is applied.

A step with an error is replayed (when the Guard was given a `replay_fn`) while the model still
holds the state from before its update: forward and gradient hooks name the first non-finite
module and parameter. Then the likely causes, ranked from every event so far, the findings and the
replay, are attached to the step's serious events. Both are advisory: a failure is logged.
"""

from __future__ import annotations

import logging

from trainguard.diagnose.ranking import likely_causes, rank_causes
from trainguard.diagnose.replay import replay
from trainguard.events import at_least
from trainguard.pipeline.context import Detected, StepContext
from trainguard.pipeline.services import Services
from trainguard.pipeline.state import RunState
from trainguard.ranked_cause import RankedCause

log = logging.getLogger("trainguard")


def explain(ctx: StepContext, state: RunState, services: Services,
            found: Detected) -> list[RankedCause]:
    """The causes ranked for a step with a warning or worse (none for a quiet step, or when the
    ranking failed); the likely ones are attached to its serious events."""
    if not any(at_least(e.severity, "warning") for e in found.events):
        return []
    # a step judged after its update, with the next step's gradients in place, has no state
    # from before it to replay on
    replayable = services.replay_fn is not None and ctx.batch is not None \
        and ctx.taken_on_device is None
    if replayable and any(at_least(e.severity, "error") for e in found.events):
        _replay(ctx, services, found)
    return _likely_causes(ctx, state, services, found)


def _replay(ctx: StepContext, services: Services, found: Detected) -> None:
    try:
        report = replay(services.model, ctx.batch, services.replay_fn)  # type: ignore[arg-type]
    except Exception as exc:  # diagnosis is best effort
        log.error("trainguard: replay failed (%s: %s)", type(exc).__name__, exc)
        return
    first = report.first
    details = {"summary": report.summary(), "deterministic": report.deterministic,
               "first_nonfinite_module": first.first_nonfinite_module.module
               if first.first_nonfinite_module else None,
               "first_overflow_module": first.first_overflow_module.module
               if first.first_overflow_module else None,
               "first_nonfinite_grad": first.first_nonfinite_grad}
    for event in found.events:
        if at_least(event.severity, "error"):
            event.details["replay"] = details


def _likely_causes(ctx: StepContext, state: RunState, services: Services,
                   found: Detected) -> list[RankedCause]:
    try:
        ranked = rank_causes(state.journal.events + found.events,
                             state.evidence_findings(found.findings), top=3,
                             fixes=services.fixes)
    except Exception as exc:  # diagnosis is best effort
        log.error("trainguard: diagnosis failed (%s: %s)", type(exc).__name__, exc)
        return []
    likely = likely_causes(ranked)
    for event in found.events:
        if likely and at_least(event.severity, "warning"):
            event.details["likely_causes"] = likely
    return ranked
