"""The order of the stages, written in one place, and `StepPipeline`, which runs them.

    before the optimizer step   measure -> detect -> explain -> decide -> act
    the optimizer step          taken by the Guard, or by the trainer (HF, Lightning)
    after it                    settle -> record

Under `sync="deferred"` a step is split: `measure_on_device` before its optimizer step (skip
flag and clip on the device, the copy to the host started), and at the next step, after its
update, `read_late -> detect -> explain -> decide -> act_late` then `settle -> record`.

Each stage is a function of (`StepContext`, `RunState`, `Services`). When trainguard itself fails
in `measure`, `detect` or `decide`, `check` returns the failure and the `Run` applies the step
unguarded (a monitoring bug must not kill a run); a failure in any other stage, or after the
decision, goes up. What a halted step does next (settle, record, close, `TrainingDiverged`) is
the run's lifecycle, in `Run.before_update`.
"""

from __future__ import annotations

from trainguard.errors import TrainguardError
from trainguard.pipeline.act import act, act_late
from trainguard.pipeline.context import PendingStats, StepContext
from trainguard.pipeline.decide import decide
from trainguard.pipeline.detect import detect
from trainguard.pipeline.explain import explain
from trainguard.pipeline.measure import measure, measure_on_device, read_late
from trainguard.pipeline.record import record
from trainguard.pipeline.services import Services, Stage
from trainguard.pipeline.settle import settle
from trainguard.pipeline.state import RunState

BEFORE_UPDATE: tuple[Stage, ...] = (measure, detect, explain, decide, act)
AFTER_UPDATE: tuple[Stage, ...] = (settle, record)
STAGE_NAMES: tuple[str, ...] = tuple(s.__name__ for s in BEFORE_UPDATE + AFTER_UPDATE)
ON_DEVICE: tuple[Stage, ...] = (measure_on_device,)
"""`sync="deferred"`: the device half of a step, before its update."""
LATE: tuple[Stage, ...] = (read_late, detect, explain, decide, act_late)
"""`sync="deferred"`: the judgement of a step whose update the device already skipped or
clipped, run at the next step."""
GUARDED = ("measure", "measure_on_device", "read_late", "detect", "decide")
"""Stages whose failure leaves the step unchecked (it is then applied unguarded)."""


class StepPipeline:
    def __init__(self, state: RunState, services: Services) -> None:
        self.state = state
        self.services = services
        self.before: tuple[Stage, ...] = BEFORE_UPDATE
        self.after: tuple[Stage, ...] = AFTER_UPDATE
        self.on_device: tuple[Stage, ...] = ON_DEVICE
        self.late: tuple[Stage, ...] = LATE
        self.queued: list[PendingStats] = []
        """Heavy-probe results on the device, waiting for the next step's transfer."""

    def check(self, ctx: StepContext) -> Exception | None:
        """Run the stages before the update. Returns the failure of a guarded stage before the
        decision (the step is then unchecked; what `measure` had not yet taken rides the next
        step), None when the step was checked and acted on."""
        return self._run(self.before, ctx, keep_carried=True)

    def start(self, ctx: StepContext) -> Exception | None:
        """`sync="deferred"`: the device half of a step, before its update. Returns its failure
        (the step is then applied unguarded), None when the device decided it."""
        return self._run(self.on_device, ctx, keep_carried=True)

    def conclude(self, ctx: StepContext) -> Exception | None:
        """`sync="deferred"`: judge a step whose update was taken; as `check`, the failure of a
        guarded stage before the decision comes back."""
        return self._run(self.late, ctx, keep_carried=False)

    def _run(self, stages: tuple[Stage, ...], ctx: StepContext, *,
             keep_carried: bool) -> Exception | None:
        """Run `stages`; a guarded stage's failure before the decision is returned (with
        `keep_carried`, the heavy-probe results not yet sent wait for the next step), any other
        failure raised."""
        for stage in stages:
            try:
                stage(ctx, self.state, self.services)
            except TrainguardError:
                raise
            except Exception as exc:
                if stage.__name__ not in GUARDED or ctx.decision is not None:
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
