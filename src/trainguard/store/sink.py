"""The run store as a sink: what a run says goes into its run directory.

    sink = RunStoreSink("runs/exp1")          # a new run in the directory
    sink = RunStoreSink("runs/exp1", resume=True)   # continue the latest run

The constructor raises `RunDirInUse` (another live writer holds the directory) and
`StoreUnavailable` (the directory cannot hold a store) so the caller decides: refuse, or warn and
train on without a store. Once open, nothing the store does can stop training: a failing disk is
reported once and the records it loses are counted.

The sink registers with `trainguard.lifecycle`, so a process that ends without closing it
(Ctrl-C, SIGTERM, a script that never calls close) still marks the run "interrupted".
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainguard import lifecycle
from trainguard.events import ActionRecord, Event, RunError, RunInfo, StepReport
from trainguard.sinks.base import Sink
from trainguard.store.writer import RunStore
from trainguard.vocabulary import Status

if TYPE_CHECKING:
    from trainguard.finding import Finding
    from trainguard.probes.sample_sheet import SampleSheet
    from trainguard.ranked_cause import RankedCause
    from trainguard.run_verdict import RunVerdict
    from trainguard.signals import SampledStats


SAMPLE_SHEETS = 16
"""Drawn samples a run keeps (meta `samples`): the first, every one the judge held broken up to
this many, the rest thinned evenly over the run."""


def kept_sheets(sheets: list[dict[str, Any]], cap: int = SAMPLE_SHEETS) -> list[dict[str, Any]]:
    """`sheets` (in step order) cut to `cap`: the first and the last stay, broken ones are
    dropped last, and among the others every second one goes, from the oldest."""
    while len(sheets) > cap:
        middle = [i for i in range(1, len(sheets) - 1) if not sheets[i]["degraded"]]
        drop = middle[::2] if middle else list(range(1, len(sheets) - 1))[::2]
        drop = drop[:len(sheets) - cap]
        sheets = [sheet for i, sheet in enumerate(sheets) if i not in set(drop)]
    return sheets


class RunStoreSink(Sink):
    def __init__(self, run_dir: str | Path, *, resume: bool = False) -> None:
        self.store = RunStore(run_dir, resume=resume)
        self.run_dir = self.store.run_dir
        self.run_id = self.store.run_id
        self._ended = False
        self._closed = False
        self._names: list[str] = []
        self._shapes: list[list[int]] = []
        self._widths: list[list[int]] = []
        self._evals: list[dict[str, Any]] = []
        self._sheets: list[dict[str, Any]] = []
        """[first step, number of watched parameters] each time the optimizer gained some."""
        self._handle = lifecycle.track(self._end_and_close)

    def on_run_start(self, run: RunInfo) -> None:
        store = self.store
        store.put_meta("trainguard_version", run.trainguard_version)
        store.put_meta("config", run.config)
        self._names = list(run.param_names)
        self._shapes = [list(shape) for shape in run.param_shapes]
        self._widths = [[0, len(self._names)]]
        store.put_meta("param_names", list(self._names))
        store.put_meta("param_shapes", list(self._shapes))
        if run.integration:
            store.put_meta("integration", run.integration)
        if run.distributed:
            store.put_meta("distributed", run.distributed)
        store.set_status("running")

    def on_findings(self, findings: list[Finding]) -> None:
        self.store.put_meta("preflight", [f.to_dict() for f in findings])

    def on_event(self, event: Event) -> None:
        self.store.put_event(event)

    def on_action(self, action: ActionRecord) -> None:
        self.store.put_action(action)
        if action.kind == "snapshot" and action.details.get("path"):
            self.store.put_meta("snapshot", str(action.details["path"]))
        elif action.kind == "watch":  # parameters added mid-run: vectors grow from this step
            self._names.extend(action.details["names"])
            self._shapes.extend(action.details["shapes"])
            self._widths.append([action.step, len(self._names)])
            self.store.put_meta("param_names", list(self._names))
            self.store.put_meta("param_shapes", list(self._shapes))
            self.store.put_meta("param_widths", list(self._widths))

    def on_diagnosis(self, causes: list[RankedCause]) -> None:
        self.store.put_meta("diagnosis", [c.to_dict() for c in causes])

    def on_step(self, report: StepReport) -> None:
        scalars: dict[str, Any] = {
            "loss": report.loss, "grad_norm": report.grad_norm, "lr": report.lr,
            "loss_scale": report.loss_scale, "action": report.action,
            "clip_coef": report.clip_coef, "sampled": report.sampled,
            "loss_curvature": report.loss_curvature}
        signals = report.signals
        grad_norms = None
        if signals is not None:
            grad_norms = np.asarray(signals.param_grad_norm)
            scalars["amp_overflow"] = signals.amp_overflow
            if len(signals.group_lrs) > 1:  # "lr" is the first group's
                scalars["lrs"] = list(signals.group_lrs)
            scalars["nonfinite_grads"] = int((~np.isfinite(grad_norms)).sum())
            if signals.fp16_grad_maxabs is not None:
                scalars["fp16_grad_maxabs"] = signals.fp16_grad_maxabs
            self.on_sampled(signals.sampled)
        self.store.put_step(report.step, scalars, grad_norms)

    def on_sampled(self, sampled: list[SampledStats]) -> None:
        for stats in sampled:  # each at the step it was measured
            if stats.per_param:
                self.store.put_param_metrics(stats.step, stats.per_param)
            if stats.per_module:
                self.store.put_module_metrics(stats.step, stats.module_names, stats.per_module)

    def on_samples(self, sheet: SampleSheet) -> None:
        self._sheets = kept_sheets([*self._sheets, {
            "step": sheet.step, "degraded": sheet.degraded, "first": sheet.first,
            "stats": dict(sheet.stats),
            "png": base64.b64encode(sheet.png()).decode("ascii")}])
        self.store.put_meta("samples", list(self._sheets))

    def on_eval(self, step: int, metrics: dict[str, float]) -> None:
        self._evals.append({"step": step, "metrics": dict(metrics)})
        self.store.put_meta("eval", list(self._evals))

    def on_verdict(self, verdict: RunVerdict) -> None:
        self.store.put_meta("verdict", verdict.to_dict())

    def on_run_error(self, error: RunError) -> None:
        self.store.put_meta("error", error.to_dict())

    def on_run_end(self, status: Status) -> None:
        self._ended = True
        self.store.set_status(status)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with lifecycle.closing():  # a signal meanwhile waits until the store is closed
            lifecycle.untrack(self._handle)
            self.store.close()

    def _end_and_close(self, status: Status) -> None:
        """At exit without close: a run that already ended keeps its status."""
        if not self._ended:
            self.on_run_end(status)
        self.close()
