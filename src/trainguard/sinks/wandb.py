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
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.events import Event
from trainguard.sinks.tracker_sink import TrackerSink
from trainguard.sinks.tracking import (
    EVENT_COLUMNS,
    OWN_AXIS,
    AlertGate,
    StepAxis,
    html_report,
    tracker_key,
)

if TYPE_CHECKING:
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


class WandbSink(TrackerSink):
    """Reports to a W&B run: `run`, or else the active one (`wandb.run`) once there is one."""

    tracker = "W&B"

    def __init__(self, run: Any = None, *, axis: StepAxis | None = None, alerts: bool = True,
                 artifacts: bool = True, close_timeout_s: float = 30.0) -> None:
        self._wandb = _wandb()  # a missing extra fails here, loudly
        super().__init__(axis=axis, artifacts=artifacts, close_timeout_s=close_timeout_s)
        self.run = run
        self.alerts = AlertGate() if alerts else None
        self._axis_set = False
        self._summary: dict[str, Any] = {}

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

    def _record(self, step: int, values: dict[str, Any]) -> None:
        run = self._target()
        if run is None or self.courier.failed is not None:
            return
        values[self._axis.key] = self._axis.value(step)
        self.courier.send(run.log, values)

    def _note(self, values: Mapping[str, Any]) -> None:
        self._summary.update(values)

    # -- the sink --------------------------------------------------------------------------------
    def on_event(self, event: Event) -> None:
        super().on_event(event)
        run = self._target()
        if run is not None and self.alerts is not None and self.alerts.admits(event):
            level = getattr(self._wandb.AlertLevel, ALERT_LEVELS[event.severity])
            where = f" ({event.param})" if event.param else ""
            self.courier.send(run.alert, title=f"trainguard: {event.kind}",
                              text=f"step {self._axis.value(event.step)}{where}: "
                                   f"{event.message}",
                              level=level, wait_duration=0)

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
        self._drain()

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

