"""The order of the stages, written in one place, and `StepPipeline`, which runs them.

    before the optimizer step   measure -> detect -> explain -> decide -> act
    the optimizer step          taken by the Guard, or by the trainer (HF, Lightning)
    after it                    settle -> record

Under `sync="deferred"` a step is split in other stages, which `pipeline/deferred.py` lists and
runs through `StepPipeline.run` (the device half) and `StepPipeline.judge` (its judgement, in the
same shape as the check).

Each stage is a function of (`StepContext`, `RunState`, `Services`) and of the results of the
stages before it that it reads, and returns its own: `measure` the step's `Measured`, `detect`
its `Detected`, `explain` the ranked causes, `decide` the `Decision`, `settle` the `Settled`
(the report) that `record` hands the sinks. The pipeline threads them; the context keeps what
passes from before the update to after it. When trainguard itself fails in `measure`, `detect`
or `decide`, `check` returns the failure and the `Run` applies the step unguarded (a monitoring
bug must not kill a run); a failure in any other stage, or after the decision, goes up. What a
halted step does next (settle, record, close, `TrainingDiverged`) is the run's lifecycle, in
`Run.before_update`.
"""

from __future__ import annotations

from trainguard.errors import TrainguardError
from trainguard.events import StepReport
from trainguard.pipeline.act import act
from trainguard.pipeline.context import Detected, Measured, PendingStats, StepContext
from trainguard.pipeline.decide import decide
from trainguard.pipeline.detect import detect
from trainguard.pipeline.explain import explain
from trainguard.pipeline.measure import measure
from trainguard.pipeline.policy import Decision
from trainguard.pipeline.record import record
from trainguard.pipeline.services import Services, Stage
from trainguard.pipeline.settle import settle
from trainguard.pipeline.state import RunState

BEFORE_UPDATE: tuple[Stage, ...] = (measure, detect, explain, decide, act)
"""measure, detect, explain, decide, act: a check's five stages, in the shape `judge` runs."""
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
        return self.judge(self.before, ctx, keep_carried=True)

    def judge(self, stages: tuple[Stage, ...], ctx: StepContext, *, keep_carried: bool,
              guarded: tuple[str, ...] = GUARDED) -> Exception | None:
        """Run a check's five stages (what measures, detect, explain, decide, what acts), each
        handed the results it reads; the failure of a `guarded` stage before the decision is
        returned (with `keep_carried`, the heavy-probe results not yet sent wait for the next
        step), any other failure raised."""
        measure_, detect_, explain_, decide_, act_ = stages
        state, services = self.state, self.services
        stage = measure_
        try:
            measured: Measured = measure_(ctx, state, services)
            ctx.measured = measured
            stage = detect_
            found: Detected = detect_(ctx, state, services, measured)
            ctx.detected(found)
            stage = explain_
            explain_(ctx, state, services, found)
            stage = decide_
            decision: Decision = decide_(ctx, state, services, measured, found)
            ctx.decide(decision)
        except TrainguardError:
            raise
        except Exception as exc:
            return self._unchecked(exc, stage, ctx, keep_carried=keep_carried, guarded=guarded)
        act_(ctx, state, services, measured, decision)
        return None

    def run(self, stages: tuple[Stage, ...], ctx: StepContext, *, keep_carried: bool,
            guarded: tuple[str, ...] = GUARDED) -> Exception | None:
        """Run `stages` of (ctx, state, services) alone (the device half of a deferred step);
        the failure of a `guarded` one is returned, any other raised."""
        for stage in stages:
            try:
                stage(ctx, self.state, self.services)
            except TrainguardError:
                raise
            except Exception as exc:
                return self._unchecked(exc, stage, ctx, keep_carried=keep_carried,
                                       guarded=guarded)
        return None

    def _unchecked(self, exc: Exception, stage: Stage, ctx: StepContext, *, keep_carried: bool,
                   guarded: tuple[str, ...]) -> Exception:
        """The failure of `stage`, returned when it leaves the step unchecked; raised again when
        the stage is not guarded or the step was decided already."""
        if stage.__name__ not in guarded or ctx.decision is not None:
            raise exc
        if keep_carried:
            self.queued = ctx.carried
        return exc

    def settle(self, ctx: StepContext) -> StepReport:
        """Run the stages after the update; the step's heavy-probe results wait for the next
        step's transfer. Returns the step's report."""
        settle_, record_ = self.after
        settled = settle_(ctx, self.state, self.services)
        record_(ctx, self.state, self.services, settled)
        self.queued.extend(settled.queued)
        return settled.report
