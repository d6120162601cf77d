"""`StepPipeline`: the order of the stages, written in one place.

    before the optimizer step   measure -> detect -> explain -> decide -> act
    the optimizer step          taken by the Guard, or by the trainer (HF, Lightning)
    after it                    settle -> record

A halted step is settled and recorded at once; the run is then closed and `TrainingDiverged`
raised. When trainguard itself fails in `measure`, `detect` or `decide`, the step is applied
unguarded (clipped as configured) and a `monitor_error` event says so: a monitoring bug must not
kill a run. A failure of trainguard's own collectives under torch.distributed is no monitoring
bug but a rank gone: the run was closed as failed and `PeerLost` goes up to the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trainguard.errors import TrainguardError, TrainingDiverged, UsageError
from trainguard.events import Event, StepReport, at_least
from trainguard.pipeline.act import Act
from trainguard.pipeline.context import PendingStats, StepContext
from trainguard.pipeline.decide import Decide
from trainguard.pipeline.detect import Detect
from trainguard.pipeline.explain import Explain
from trainguard.pipeline.measure import Measure
from trainguard.pipeline.record import Record
from trainguard.pipeline.settle import Settle

if TYPE_CHECKING:
    from trainguard.pipeline.run import Run

log = logging.getLogger("trainguard")

Stage = Callable[[StepContext], None]
"""A stage reads and writes the step's context; each has a `name`."""

BEFORE_UPDATE: tuple[Any, ...] = (Measure, Detect, Explain, Decide, Act)
AFTER_UPDATE: tuple[Any, ...] = (Settle, Record)
"""Stage classes: each takes the `Run` and has a `name`."""
STAGE_NAMES: tuple[str, ...] = tuple(t.name for t in BEFORE_UPDATE + AFTER_UPDATE)
_GUARDED = ("measure", "detect", "decide")
"""Stages whose failure leaves the step unchecked (it is then applied unguarded)."""


class StepPipeline:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.before: Sequence[Stage] = [t(run) for t in BEFORE_UPDATE]
        self.after: Sequence[Stage] = [t(run) for t in AFTER_UPDATE]
        self._pending: StepContext | None = None
        self.queued: list[PendingStats] = []
        """Heavy-probe results on the device, waiting for the next step's transfer."""

    def before_update(self, loss: Any, *, batch: Any = None,
                      data_ids: Any = None) -> StepContext:
        """Check the step and act on its gradients. Call once per optimizer step, after the
        gradients are final and unscaled, before `optimizer.step()`. Raises TrainingDiverged
        when the step halts the run; `ctx.unguarded` is set when the check itself failed."""
        run = self.run
        if run.closed:
            run.raise_if_peer_lost()
            raise UsageError("trainguard is closed for this run; start a new one to keep training")
        state = run.state
        if run.dist is not None:
            run.dist.link.step = state.step
        ctx = StepContext(step=state.step, loss=loss, batch=batch,
                          data_ids=state.data_position if data_ids is None else data_ids,
                          sampled=run.sampled_now, carried=self.queued)
        self.queued = []
        state.data_position += 1
        self._pending = None
        for stage in self.before:
            try:
                stage(ctx)
            except TrainguardError:
                raise
            except Exception as exc:
                if getattr(stage, "name", "") not in _GUARDED or ctx.decision is not None:
                    raise
                self.queued = ctx.carried  # what measure did not take rides the next step
                if ctx.new_params is not None:  # said outside a step: record will not run
                    run.emit_action(ctx.new_params)
                run.add_findings(ctx.findings)
                ctx.events[:] = [run.unguarded(exc)]
                ctx.unguarded = exc
                return ctx
        if ctx.outcome == "halted":
            self._halt(ctx)
        self._pending = ctx
        return ctx

    def after_update(self, ctx: StepContext | None = None) -> StepReport | None:
        """Settle and record the step checked by `before_update`; call after the optimizer step
        and the scheduler step. None when no step was pending (the check failed)."""
        pending, self._pending = self._pending, None
        if ctx is not None and ctx is not pending:
            pending = None if ctx.unguarded is not None else ctx
        if pending is None or self.run.closed:
            return None
        for stage in self.after:
            stage(pending)
        self.queued.extend(pending.queued)
        return pending.report

    def _halt(self, ctx: StepContext) -> None:
        for stage in self.after:
            stage(ctx)
        run = self.run
        diagnosis = run.close(status="halted")
        threshold = run.config.halt_severity
        causes: list[Event] = ([e for e in ctx.events if at_least(e.severity, threshold)]
                               or ctx.events)
        raise TrainingDiverged(
            f"training halted at step {ctx.step}: " + "; ".join(e.message for e in causes)
            + (f". Crash snapshot: {ctx.snapshot_path}" if ctx.snapshot_path else ""),
            snapshot_path=ctx.snapshot_path, events=causes, report=ctx.report,
            diagnosis=diagnosis)
