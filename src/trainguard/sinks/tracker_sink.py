"""`TrackerSink`: the half of a tracker's sink that `WandbSink` and `MlflowSink` share.

Both keep the run's parameter names (sampled per-layer values are named by them), the events
table (its first `TABLE_ROWS` rows, every event counted), the crash snapshot's path and the last
step; both send each step's, each sampled step's and each evaluation's values at the step they
belong to (`_record`), and the diagnosis and the verdict as the run's summary or tags
(`_note`). How the values reach the tracker (a W&B run's `log`, MLflow metric batches) is the
subclass's, always through its `Courier`, off the training thread.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trainguard.events import ActionRecord, Event, RunInfo, StepReport
from trainguard.sinks.base import Sink
from trainguard.sinks.courier import Courier
from trainguard.sinks.tracking import (
    OWN_AXIS,
    TABLE_ROWS,
    StepAxis,
    cause_values,
    eval_values,
    event_row,
    sampled_values,
    step_axis,
    step_values,
    verdict_values,
)

if TYPE_CHECKING:
    from trainguard.ranked_cause import RankedCause
    from trainguard.run_verdict import RunVerdict
    from trainguard.signals import SampledStats

log = logging.getLogger("trainguard")


class TrackerSink(Sink, ABC):
    """A sink that reports into an experiment tracker's run (see the module's docstring)."""

    tracker = "the tracker"
    """The tracker's name, as messages say it."""

    def __init__(self, *, axis: StepAxis | None, artifacts: bool,
                 close_timeout_s: float) -> None:
        self.axis = axis
        """The step axis (None: the trainer's, from `RunInfo.integration`)."""
        self.artifacts = artifacts
        self.close_timeout_s = close_timeout_s
        self.courier = Courier(type(self).__name__)
        self._axis = axis or OWN_AXIS
        self._names: list[str] = []
        self._run_dir: str | None = None
        self._events: list[list[Any]] = []
        self._event_count = 0
        self._snapshot: str | None = None
        self._last_step = 0
        self._closed = False

    @property
    def failed(self) -> str | None:
        """Why the sink stopped (the tracker raised), None while it reports."""
        return self.courier.failed

    # -- what a tracker's sink does its own way ---------------------------------------------------
    @abstractmethod
    def _target(self) -> Any:
        """The tracker's run once there is one (None before)."""

    @abstractmethod
    def _record(self, step: int, values: dict[str, Any]) -> None:
        """Send `values` at `step` (trainguard's step; the axis gives the tracker's)."""

    @abstractmethod
    def _note(self, values: Mapping[str, Any]) -> None:
        """Keep `values` for the run's summary or tags, sent at the latest at close."""

    def _drain(self) -> None:
        """Wait, at most `close_timeout_s`, for the courier to send what it holds."""
        if not self.courier.drain(self.close_timeout_s):
            log.warning("trainguard: %s did not take trainguard's last records within %.0f s; "
                        "they are left to its background thread", self.tracker,
                        self.close_timeout_s)

    # -- the sink --------------------------------------------------------------------------------
    def on_run_start(self, run: RunInfo) -> None:
        self._names = list(run.param_names)
        self._run_dir = run.run_dir
        self._axis = self.axis or step_axis(run.integration)
        self._target()

    def on_event(self, event: Event) -> None:
        self._event_count += 1
        if len(self._events) < TABLE_ROWS:
            self._events.append(event_row(event, self._axis))

    def on_action(self, action: ActionRecord) -> None:
        if action.kind == "snapshot" and action.details.get("path"):
            self._snapshot = str(action.details["path"])
        if action.kind == "watch":  # parameters added mid-run
            self._names.extend(action.details.get("names", []))

    def on_step(self, report: StepReport) -> None:
        self._last_step = report.step
        self._record(report.step, step_values(report))
        if report.signals is not None:
            self.on_sampled(report.signals.sampled)

    def on_sampled(self, stats: list[SampledStats]) -> None:
        for sample in stats:  # each at the step it was measured
            self._record(sample.step, sampled_values(sample, self._names))

    def on_eval(self, step: int, metrics: dict[str, float]) -> None:
        self._record(step, eval_values(metrics))

    def on_diagnosis(self, causes: list[RankedCause]) -> None:
        self._note(cause_values(causes))

    def on_verdict(self, verdict: RunVerdict) -> None:
        self._note(verdict_values(verdict))
