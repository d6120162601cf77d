"""Stage 3, `explain`: why this step went wrong, before anything is applied.

A step with an error is replayed (when the Guard was given a `replay_fn`) while the model still
holds the state from before its update: forward and gradient hooks name the first non-finite
module and parameter. Then the likely causes, ranked from every event so far, the findings and the
replay, are attached to the step's serious events. Both are advisory: a failure is logged.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from trainguard.diagnose.ranking import rank_causes
from trainguard.diagnose.replay import replay
from trainguard.events import at_least
from trainguard.pipeline.context import StepContext

if TYPE_CHECKING:
    from trainguard.pipeline.run import Run

log = logging.getLogger("trainguard")


class Explain:
    name = "explain"

    def __init__(self, run: Run) -> None:
        self.run = run

    def __call__(self, ctx: StepContext) -> None:
        if not any(at_least(e.severity, "warning") for e in ctx.events):
            return
        if self.run.replay_fn is not None and ctx.batch is not None and any(
                at_least(e.severity, "error") for e in ctx.events):
            self._replay(ctx)
        self._likely_causes(ctx)

    def _replay(self, ctx: StepContext) -> None:
        try:
            report = replay(self.run.model, ctx.batch, self.run.replay_fn)  # type: ignore[arg-type]
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
        for event in ctx.events:
            if at_least(event.severity, "error"):
                event.details["replay"] = details

    def _likely_causes(self, ctx: StepContext) -> None:
        try:
            ranked = rank_causes(self.run.events + ctx.events,
                                 self.run.evidence_findings(ctx.findings), top=3)
        except Exception as exc:  # diagnosis is best effort
            log.error("trainguard: diagnosis failed (%s: %s)", type(exc).__name__, exc)
            return
        likely = [{"code": c.code, "confidence": round(c.confidence, 3)} for c in ranked]
        for event in ctx.events:
            if likely and at_least(event.severity, "warning"):
                event.details["likely_causes"] = likely
