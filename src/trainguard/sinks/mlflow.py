"""MLflow: what a run says, in the MLflow run the training already reports to.

    import mlflow
    from trainguard.sinks import MlflowSink
    with mlflow.start_run():
        guard = Guard(model, optimizer, sinks=[MlflowSink()])   # or nothing: it is found

Needs the `mlflow` package (`pip install 'trainguard[mlflow]'`). It logs through an
`MlflowClient` to the run given (`run_id`, `client` or `tracking_uri`), or else to the active
run (`mlflow.active_run()`) once there is one. What reaches the run, at the step the trainer
logs on (the Hugging Face Trainer's `global_step`, Lightning's, or the optimizer step in a plain
loop):

    metrics     the same keys as `WandbSink`'s: trainguard/grad_norm, clip_coef, skipped, loss,
                lr, loss_scale, trainguard/nonfinite/*, trainguard/events/<severity> on a step
                with events, trainguard/layers/<stat>/<layer> on sampled steps,
                trainguard/eval/<metric>
    tags        trainguard/verdict, trainguard/verdict_message, trainguard/causes,
                trainguard/cause/<rank> (with /evidence and /fix), trainguard/status,
                trainguard/events_count, trainguard/last_event (the latest warning or worse)
    artifacts   trainguard/events.json (every event, in MLflow's table format), the crash
                snapshot and the HTML report (with a run_dir) under trainguard/

Every key is made of the characters MLflow allows. NaN is logged as NaN (MLflow keeps it), inf
as MLflow stores it (±1.8e308), and both are counted in `trainguard/nonfinite/*`. Metrics are
gathered on the training thread and sent in batches (at most every `flush_s` seconds) by a
background thread (`Courier`): a step never waits for the store. If MLflow raises, that is one
warning and the sink stops; training goes on. The run is not ended here: it belongs to the code
that started it.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.events import Event, at_least
from trainguard.sinks.tracker_sink import TrackerSink
from trainguard.sinks.tracking import EVENT_COLUMNS, StepAxis, html_report, tracker_key

if TYPE_CHECKING:
    from trainguard.vocabulary import Status

log = logging.getLogger("trainguard")

INSTALL_HINT = "pip install 'trainguard[mlflow]'"
BATCH_LIMIT = 1000
"""MLflow's most metrics in one `log_batch`."""
WAITING_POINTS = 100_000
"""Metric points kept while the run to send them to has not started (a `report_to` whose tracker
starts its run later): the newest, sent when it starts."""
TAG_LIMIT = 5000
"""Characters of a tag value that MLflow keeps in every backend."""

Point = tuple[str, float, int, int]
"""A metric point: key, value, timestamp (ms), step."""


def _mlflow() -> Any:
    try:
        import mlflow
    except ImportError as exc:
        raise ImportError(f"MlflowSink needs the mlflow package: {INSTALL_HINT} ({exc})") from exc
    return mlflow


class MlflowSink(TrackerSink):
    """Reports to an MLflow run: `run_id`, or else the active one once there is one."""

    tracker = "MLflow"

    def __init__(self, run_id: str | None = None, *, client: Any = None,
                 tracking_uri: str | None = None, axis: StepAxis | None = None,
                 artifacts: bool = True, flush_s: float = 2.0,
                 close_timeout_s: float = 30.0) -> None:
        self._mlflow = _mlflow()  # a missing extra fails here, loudly
        super().__init__(axis=axis, artifacts=artifacts, close_timeout_s=close_timeout_s)
        self.run_id = run_id
        self.client = client
        self.tracking_uri = tracking_uri
        self.flush_s = flush_s
        self._points: list[Point] = []
        self._tags: dict[str, str] = {}
        self._last_flush = time.monotonic()
        self.waiting_dropped = 0
        """Metric points dropped, the oldest first, while no run had started."""

    # -- the tracker -----------------------------------------------------------------------------
    def _target(self) -> str | None:
        """The run's id, once there is a run (a trainer's tracker may start it after
        trainguard); the client is made with it, on this thread."""
        if self.run_id is None:
            active = self.courier.now(self._mlflow.active_run)
            if active is None:
                return None
            self.run_id = active.info.run_id
        if self.client is None:
            self.client = self.courier.now(self._mlflow.MlflowClient, self.tracking_uri)
        return self.run_id if self.client is not None else None

    def _record(self, step: int, values: dict[str, Any]) -> None:
        if self.courier.failed is not None:
            return
        at, stamp = self._axis.value(step), int(time.time() * 1000)
        self._points.extend((key, value, stamp, at) for key, value in values.items())
        if (len(self._points) >= BATCH_LIMIT
                or time.monotonic() - self._last_flush >= self.flush_s):
            self._flush()

    def _flush(self) -> None:
        self._last_flush = time.monotonic()
        run_id = self._target()
        if run_id is None and len(self._points) > WAITING_POINTS:  # no run yet: keep the last
            self.waiting_dropped += len(self._points) - WAITING_POINTS
            del self._points[:len(self._points) - WAITING_POINTS]
        if run_id is None or not (self._points or self._tags):
            return
        points, self._points = self._points, []
        tags, self._tags = self._tags, {}
        self.courier.send(self._send, run_id, points, tags)

    def _send(self, run_id: str, points: list[Point], tags: dict[str, str]) -> None:
        """On the courier's thread: MLflow's own types are made here, not on the step's."""
        from mlflow.entities import Metric, RunTag

        metrics = [Metric(key, value, stamp, step) for key, value, stamp, step in points]
        run_tags = [RunTag(key, value[:TAG_LIMIT]) for key, value in tags.items()]
        for start in range(0, max(len(metrics), 1), BATCH_LIMIT):
            self.client.log_batch(run_id, metrics=metrics[start:start + BATCH_LIMIT],
                                  tags=run_tags if start == 0 else [])

    def _note(self, values: Mapping[str, Any]) -> None:
        self._tags.update(values)

    # -- the sink --------------------------------------------------------------------------------
    def on_event(self, event: Event) -> None:
        super().on_event(event)
        if at_least(event.severity, "warning"):
            self._tags[tracker_key("last_event")] = (
                f"step {self._axis.value(event.step)}: {event.severity} {event.kind}: "
                f"{event.message}")

    def on_run_end(self, status: Status) -> None:
        self._tags[tracker_key("status")] = status
        self._tags[tracker_key("events_count")] = str(self._event_count)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.courier.failed is None:
            self._flush()
            run_id = self._target()
            if run_id is not None and (self._events or self.artifacts):
                self.courier.send(self._log_files, run_id)
        self._drain()

    def _log_files(self, run_id: str) -> None:
        """The events table, the crash snapshot and the HTML report, under `trainguard/`."""
        if self._events:
            table = {"columns": EVENT_COLUMNS, "data": self._events}
            self.client.log_text(run_id, json.dumps(table), "trainguard/events.json")
        if not self.artifacts:
            return
        if self._snapshot and Path(self._snapshot).is_file():
            self.client.log_artifact(run_id, self._snapshot, "trainguard")
        with tempfile.TemporaryDirectory(prefix="trainguard-") as tmp:
            report = html_report(self._run_dir, Path(tmp) / "trainguard-report.html")
            if report is not None:
                self.client.log_artifact(run_id, str(report), "trainguard")

