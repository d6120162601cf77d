"""The sink contract and the fan-out that isolates failures.

A sink hears everything a run says, in this order: `on_run_start` once; then, as they happen,
`on_findings` (the preflight audit, runtime checks), `on_event`, `on_action` (skip, clip, rollback,
LR change, halt, snapshot), `on_step` once per step and `on_samples` (a generative model's samples,
drawn, when the Guard has a `sample_fn`); at the end `on_sampled` (the last sampled
statistics), `on_diagnosis` (the ranked causes), `on_verdict` (did training work: healthy,
recovered, degraded), `on_run_error` when an exception ended the run (its type and message),
`on_run_end` with the run's status (`finished`, `halted`, `failed` (a rank lost under
torch.distributed), `crashed`, `interrupted`) and `close`. Sinks observe only: they must
not change training. Under torch.distributed only rank 0 has sinks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from trainguard.events import ActionRecord, Event, RunError, RunInfo, StepReport
from trainguard.vocabulary import Status

if TYPE_CHECKING:
    from trainguard.finding import Finding
    from trainguard.probes.sample_sheet import SampleSheet
    from trainguard.ranked_cause import RankedCause
    from trainguard.run_verdict import RunVerdict
    from trainguard.signals import SampledStats

log = logging.getLogger("trainguard")

SINK_METHODS = ("on_run_start", "on_findings", "on_event", "on_action", "on_diagnosis",
                "on_step", "on_samples", "on_eval", "on_sampled", "on_verdict", "on_run_error",
                "on_run_end", "close")


class Sink:
    """Observe-only: override what you need; every method defaults to doing nothing."""

    def on_run_start(self, run: RunInfo) -> None:
        """Called once, before the first step."""

    def on_findings(self, findings: list[Finding]) -> None:
        """Called with every finding so far whenever new ones arrive (preflight, runtime checks)."""

    def on_event(self, event: Event) -> None:
        """Called as soon as an event is detected (its likely causes and replay attached)."""

    def on_action(self, action: ActionRecord) -> None:
        """Called when trainguard changes the run: skip, clip, rollback, LR change, halt."""

    def on_diagnosis(self, causes: list[RankedCause]) -> None:
        """Called with the ranked likely causes whenever they are (re)computed."""

    def on_step(self, report: StepReport) -> None:
        """Called once per step, after the step was applied, skipped, rolled back or halted.
        `report.signals.sampled` holds the heavy-probe statistics that arrived with the step."""

    def on_samples(self, sheet: SampleSheet) -> None:
        """Called after the steps whose end made samples (`Guard(sample_fn=...)`), with them
        drawn in one strip, their statistics and whether the sample judge holds them broken."""

    def on_eval(self, step: int, metrics: dict[str, float]) -> None:
        """Called with evaluation metrics (`guard.observe_eval`, a trainer's evaluation), NaN
        kept."""

    def on_sampled(self, stats: list[SampledStats]) -> None:
        """Called at the end of a run with the last heavy-probe statistics, which no later step
        carried."""

    def on_verdict(self, verdict: RunVerdict) -> None:
        """Called once at the end, before `on_run_end`, with the run's verdict (healthy,
        recovered, degraded; see `trainguard.verdict`), when any loss was seen."""

    def on_run_error(self, error: RunError) -> None:
        """Called once before `on_run_end` when an exception ended the run (Ctrl-C, a signal,
        an error of the loop or the trainer), with its type and message."""

    def on_run_end(self, status: Status) -> None:
        """Called once with the run's final status."""

    def close(self) -> None:
        """Called once after `on_run_end`: release files and connections."""


class SinkSet:
    """Calls every sink; a sink that raises is reported once and then left out."""

    def __init__(self, sinks: Iterable[Sink] = ()) -> None:
        self.sinks: list[Sink] = list(sinks)
        self.failures: dict[str, str] = {}

    def _call(self, method: str, *args: object) -> None:
        for sink in list(self.sinks):
            handler = getattr(sink, method, None)
            if handler is None:  # a duck-typed sink that does not need this call
                continue
            try:
                handler(*args)
            except Exception as exc:  # a monitoring bug must not kill the run
                name = type(sink).__name__
                self.failures[name] = f"{type(exc).__name__}: {exc}"
                self.sinks.remove(sink)
                log.error("trainguard: sink %s failed in %s (%s) and was disabled; training "
                          "goes on", name, method, self.failures[name])

    def on_run_start(self, run: RunInfo) -> None:
        self._call("on_run_start", run)

    def on_findings(self, findings: list[Finding]) -> None:
        self._call("on_findings", findings)

    def on_event(self, event: Event) -> None:
        self._call("on_event", event)

    def on_action(self, action: ActionRecord) -> None:
        self._call("on_action", action)

    def on_diagnosis(self, causes: list[RankedCause]) -> None:
        self._call("on_diagnosis", causes)

    def on_step(self, report: StepReport) -> None:
        self._call("on_step", report)

    def on_samples(self, sheet: SampleSheet) -> None:
        self._call("on_samples", sheet)

    def on_eval(self, step: int, metrics: dict[str, float]) -> None:
        self._call("on_eval", step, metrics)

    def on_sampled(self, stats: list[SampledStats]) -> None:
        self._call("on_sampled", stats)

    def on_verdict(self, verdict: RunVerdict) -> None:
        self._call("on_verdict", verdict)

    def on_run_error(self, error: RunError) -> None:
        self._call("on_run_error", error)

    def on_run_end(self, status: Status) -> None:
        self._call("on_run_end", status)

    def close(self) -> None:
        self._call("close")
