"""Weights & Biases: what a run says, in the W&B run the training already reports to.

    import wandb
    from trainguard.sinks import WandbSink
    wandb.init(project="finetune")
    guard = Guard(model, optimizer, sinks=[WandbSink()])   # or nothing: an active run is found

Needs the `wandb` package (`pip install 'trainguard[wandb]'`). What reaches the run, on the step
axis of the trainer the run is guarded in (`train/global_step` under the Hugging Face Trainer,
`trainer/global_step` under Lightning, `trainguard/step`, the optimizer step, in a plain loop):

    every step      trainguard/grad_norm (global, before clipping), clip_coef, skipped, loss,
                    lr, loss_scale, the non-finite counts trainguard/nonfinite/{loss,grad_norm,
                    grads}, and on a step with events trainguard/events/<severity> (their count)
    sampled steps   per-layer health grouped by statistic: trainguard/layers/<stat>/<layer>
                    (grad_norm, update_ratio, weight_norm, act_zero_frac, ...), and the counts
                    trainguard/nonfinite/{weight,act}_nonfinite
    evaluations     trainguard/eval/<metric>
    events          a W&B alert for each warning or worse (at most one per kind every 5
                    minutes, 20 in a run: `AlertGate`), and the table trainguard/events at the
                    end (every event: step, severity, kind, parameter, value, message)
    the end         the summary's trainguard/verdict, trainguard/verdict_message,
                    trainguard/causes and trainguard/cause/<rank>, trainguard/status; the crash
                    snapshot and the HTML report (with a run_dir) as the artifact
                    `trainguard-<run id>`

NaN and inf are logged as they are (W&B keeps them) and counted in `trainguard/nonfinite/*`.
The calls to W&B are made on a background thread (`Courier`): a step only queues them. If W&B
raises, that is one warning and the sink stops; training goes on. The tracker's run is not
finished here: it belongs to the code that started it.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.events import ActionRecord, Event, RunInfo, StepReport
from trainguard.sinks.base import Sink
from trainguard.sinks.courier import Courier
from trainguard.sinks.tracking import (
    EVENT_COLUMNS,
    OWN_AXIS,
    TABLE_ROWS,
    AlertGate,
    StepAxis,
    cause_values,
    eval_values,
    event_row,
    html_report,
    sampled_values,
    step_axis,
    step_values,
    tracker_key,
    verdict_values,
)

if TYPE_CHECKING:
    from trainguard.ranked_cause import RankedCause
    from trainguard.run_verdict import RunVerdict
    from trainguard.signals import SampledStats
    from trainguard.vocabulary import Status

log = logging.getLogger("trainguard")

INSTALL_HINT = "pip install 'trainguard[wandb]'"
ALERT_LEVELS = {"warning": "WARN", "error": "ERROR", "critical": "ERROR"}


def _wandb() -> Any:
    try:
        import wandb
    except ImportError as exc:
        raise ImportError(f"WandbSink needs the wandb package: {INSTALL_HINT} ({exc})") from exc
    return wandb


class WandbSink(Sink):
    """Reports to a W&B run: `run`, or else the active one (`wandb.run`) once there is one."""

    def __init__(self, run: Any = None, *, axis: StepAxis | None = None, alerts: bool = True,
                 artifacts: bool = True, close_timeout_s: float = 30.0) -> None:
        self._wandb = _wandb()  # a missing extra fails here, loudly
        self.run = run
        self.axis = axis
        """The step axis (None: the trainer's, from `RunInfo.integration`)."""
        self.alerts = AlertGate() if alerts else None
        self.artifacts = artifacts
        self.close_timeout_s = close_timeout_s
        self.courier = Courier("WandbSink")
        self._axis = axis or OWN_AXIS
        self._axis_set = False
        self._names: list[str] = []
        self._run_dir: str | None = None
        self._events: list[list[Any]] = []
        self._event_count = 0
        self._snapshot: str | None = None
        self._summary: dict[str, Any] = {}
        self._last_step = 0
        self._closed = False

    @property
    def failed(self) -> str | None:
        """Why the sink stopped (W&B raised), None while it reports."""
        return self.courier.failed

    # -- the tracker -----------------------------------------------------------------------------
    def _target(self) -> Any:
        """The W&B run, once there is one (a trainer's tracker may start it after trainguard)."""
        if self.run is None:
            self.run = self._wandb.run
        if self.run is not None and not self._axis_set:
            self._axis_set = True
            if self._axis is OWN_AXIS:  # a trainer's tracker defines its own axis
                self.courier.now(self._define_own_axis, self.run)
        return self.run

    @staticmethod
    def _define_own_axis(run: Any) -> None:
        run.define_metric(OWN_AXIS.key, hidden=True)
        run.define_metric(tracker_key("*"), step_metric=OWN_AXIS.key)

    def _log(self, step: int, values: dict[str, Any]) -> None:
        run = self._target()
        if run is None or self.courier.failed is not None:
            return
        values[self._axis.key] = self._axis.value(step)
        self.courier.send(run.log, values)

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
        run = self._target()
        if run is not None and self.alerts is not None and self.alerts.admits(event):
            level = getattr(self._wandb.AlertLevel, ALERT_LEVELS[event.severity])
            where = f" ({event.param})" if event.param else ""
            self.courier.send(run.alert, title=f"trainguard: {event.kind}",
                              text=f"step {self._axis.value(event.step)}{where}: "
                                   f"{event.message}",
                              level=level, wait_duration=0)

    def on_action(self, action: ActionRecord) -> None:
        if action.kind == "snapshot" and action.details.get("path"):
            self._snapshot = str(action.details["path"])
        if action.kind == "watch":  # parameters added mid-run
            self._names.extend(action.details.get("names", []))

    def on_step(self, report: StepReport) -> None:
        self._last_step = report.step
        self._log(report.step, step_values(report))
        if report.signals is not None:
            self.on_sampled(report.signals.sampled)

    def on_sampled(self, stats: list[SampledStats]) -> None:
        for sample in stats:  # each at the step it was measured
            self._log(sample.step, sampled_values(sample, self._names))

    def on_eval(self, step: int, metrics: dict[str, float]) -> None:
        self._log(step, eval_values(metrics))

    def on_diagnosis(self, causes: list[RankedCause]) -> None:
        self._summary.update(cause_values(causes))

    def on_verdict(self, verdict: RunVerdict) -> None:
        self._summary.update(verdict_values(verdict))

    def on_run_end(self, status: Status) -> None:
        self._summary[tracker_key("status")] = status

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        run = self._target()
        if run is not None and self.courier.failed is None:
            if self._events:
                self.courier.send(self._log_events, run, self._axis.value(self._last_step))
            if self.alerts is not None and self.alerts.held:
                self._summary[tracker_key("alerts_held")] = self.alerts.held
            self._summary[tracker_key("events_count")] = self._event_count
            self.courier.send(run.summary.update, self._summary)
            if self.artifacts:
                self.courier.send(self._log_artifacts, run)
        if not self.courier.drain(self.close_timeout_s):
            log.warning("trainguard: W&B did not take trainguard's last records within %.0f s; "
                        "they are left to its background thread", self.close_timeout_s)

    def _log_events(self, run: Any, at: int) -> None:
        """Every event as one table, logged at the last step."""
        table = self._wandb.Table(columns=EVENT_COLUMNS, data=self._events)
        run.log({tracker_key("events"): table, self._axis.key: at})

    def _log_artifacts(self, run: Any) -> None:
        """The crash snapshot and the HTML report, as one artifact of the run."""
        files = [Path(self._snapshot)] if self._snapshot and Path(self._snapshot).is_file() else []
        with tempfile.TemporaryDirectory(prefix="trainguard-") as tmp:
            report = html_report(self._run_dir, Path(tmp) / "trainguard-report.html")
            files += [report] if report is not None else []
            if not files:
                return
            artifact = self._wandb.Artifact(f"trainguard-{run.id}", type="trainguard")
            for path in files:
                artifact.add_file(str(path), name=path.name)  # copied now: tmp may go
            run.log_artifact(artifact)

