"""The order of the stages, written in one place, and `StepPipeline`, which runs them.

    before the optimizer step   measure -> detect -> explain -> decide -> act
    the optimizer step          taken by the Guard, or by the trainer (HF, Lightning)
    after it                    settle -> record

Under `sync="deferred"` a step is split in other stages, which `pipeline/deferred.py` lists and
runs through `StepPipeline.run`.

Each stage is a function of (`StepContext`, `RunState`, `Services`). When trainguard itself fails
in `measure`, `detect` or `decide`, `check` returns the failure and the `Run` applies the step
unguarded (a monitoring bug must not kill a run); a failure in any other stage, or after the
decision, goes up. What a halted step does next (settle, record, close, `TrainingDiverged`) is
the run's lifecycle, in `Run.before_update`.
"""

from __future__ import annotations

from trainguard.errors import TrainguardError
from trainguard.pipeline.act import act
from trainguard.pipeline.context import PendingStats, StepContext
from trainguard.pipeline.decide import decide
from trainguard.pipeline.detect import detect
from trainguard.pipeline.explain import explain
from trainguard.pipeline.measure import measure
from trainguard.pipeline.record import record
from trainguard.pipeline.services import Services, Stage
from trainguard.pipeline.settle import settle
from trainguard.pipeline.state import RunState

BEFORE_UPDATE: tuple[Stage, ...] = (measure, detect, explain, decide, act)
AFTER_UPDATE: tuple[Stage, ...] = (settle, record)
STAGE_NAMES: tuple[str, ...] = tuple(s.__name__ for s in BEFORE_UPDATE + AFTER_UPDATE)
GUARDED = ("measure", "detect", "decide")
"""Stages whose failure leaves the step unchecked (it is then applied unguarded)."""


class StepPipeline:
    def __init__(self, state: RunState, services: Services) -> None:
        self.state = state
        self.services = services
        self.before: tuple[Stage, ...] = BEFORE_UPDATE
        self.after: tuple[Stage, ...] = AFTER_UPDATE
        self.queued: list[PendingStats] = []
        """Heavy-probe results on the device, waiting for the next step's transfer."""

    def check(self, ctx: StepContext) -> Exception | None:
        """Run the stages before the update. Returns the failure of a guarded stage before the
        decision (the step is then unchecked; what `measure` had not yet taken rides the next
        step), None when the step was checked and acted on."""
        return self.run(self.before, ctx, keep_carried=True)

    def run(self, stages: tuple[Stage, ...], ctx: StepContext, *, keep_carried: bool,
            guarded: tuple[str, ...] = GUARDED) -> Exception | None:
        """Run `stages`; the failure of a `guarded` stage before the decision is returned (with
        `keep_carried`, the heavy-probe results not yet sent wait for the next step), any other
        failure raised."""
        for stage in stages:
            try:
                stage(ctx, self.state, self.services)
            except TrainguardError:
                raise
            except Exception as exc:
                if stage.__name__ not in guarded or ctx.decision is not None:
                    raise
                if keep_carried:
                    self.queued = ctx.carried
                return exc
        return None

    def settle(self, ctx: StepContext) -> None:
        """Run the stages after the update; the step's heavy-probe results wait for the next
        step's transfer."""
        for stage in self.after:
            stage(ctx, self.state, self.services)
        self.queued.extend(ctx.queued)
