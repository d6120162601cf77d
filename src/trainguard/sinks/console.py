"""The console: what a person watching the run should read, on stderr, one line per item.

Preflight and runtime findings of warning severity and worse; every event, followed by the
replay's summary and the likely causes when the step has them (once per step); the actions that
change the run beyond a step (halt, crash snapshot, clipping taken over from a trainer); and the
diagnosis when the run halts. Skips and rollbacks are told by their events. This is the only
place trainguard prints during training; `GuardConfig(console=False)` turns it off.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from trainguard.events import ActionRecord, Event
from trainguard.sinks.base import Sink

if TYPE_CHECKING:
    from trainguard.diagnose.finding import Finding
    from trainguard.diagnose.ranking import RankedCause
    from trainguard.verdict import RunVerdict

_COLOURS = {"info": "36", "warning": "33", "error": "31", "critical": "1;31"}
_SHOWN_ACTIONS = ("halt", "snapshot", "clip_takeover")


class ConsoleSink(Sink):
    def __init__(self, stream: TextIO | None = None, *, colour: bool | None = None) -> None:
        self.stream = stream
        self.colour = colour
        self._findings_seen = 0
        self._causes_step: int | None = None
        self._diagnosis: list[RankedCause] = []

    def _write(self, text: str, severity: str | None = None) -> None:
        stream = self.stream or sys.stderr
        colour = self.colour if self.colour is not None else stream.isatty()
        if colour and severity is not None:
            text = f"\033[{_COLOURS.get(severity, '0')}m{text}\033[0m"
        print(text, file=stream, flush=True)

    def on_findings(self, findings: list[Finding]) -> None:
        label = "preflight" if self._findings_seen == 0 else "check"
        for finding in findings[self._findings_seen:]:
            if finding.severity != "info":
                self._write(f"trainguard {label} {finding}", finding.severity)
        self._findings_seen = len(findings)

    def on_event(self, event: Event) -> None:
        self._write(f"trainguard {event}", event.severity)
        replayed = event.details.get("replay")
        if isinstance(replayed, dict) and replayed.get("summary"):
            self._write(f"trainguard replay: {replayed['summary']}")
        likely = event.details.get("likely_causes")
        if likely and self._causes_step != event.step:
            self._causes_step = event.step
            self._write("trainguard likely causes: " + ", ".join(
                f"{c['code']} {c['confidence']:.0%}" for c in likely) + _fix(likely[0]["code"]))

    def on_action(self, action: ActionRecord) -> None:
        if action.kind in _SHOWN_ACTIONS:
            self._write(f"trainguard: {action.message}",
                        "critical" if action.kind == "halt" else None)

    def on_diagnosis(self, causes: list[RankedCause]) -> None:
        self._diagnosis = list(causes)

    def on_verdict(self, verdict: RunVerdict) -> None:
        if verdict.verdict == "degraded":
            self._write(f"trainguard verdict: DEGRADED: {verdict.message}", "warning")
        elif verdict.verdict == "recovered":
            self._write(f"trainguard verdict: recovered: {verdict.message}")

    def on_run_end(self, status: str) -> None:
        if status == "halted" and self._diagnosis:
            self._write("trainguard diagnosis: " + " | ".join(str(c) for c in self._diagnosis[:3]))


def _fix(code: str) -> str:
    from trainguard.diagnose.causes import CAUSES

    cause = CAUSES.get(code)
    return f". Fix: {cause.fix}" if cause is not None else ""
