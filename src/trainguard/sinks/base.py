"""The sink contract and the fan-out that isolates failures."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from trainguard.events import Event, StepReport

log = logging.getLogger("trainguard")


class Sink:
    """Observe-only: sinks must not change training. Override what you need."""

    def on_event(self, event: Event) -> None:
        """Called as soon as an event is detected."""

    def on_step(self, report: StepReport) -> None:
        """Called once per step, after the step was applied, skipped or halted."""

    def close(self) -> None:
        """Called once when the Guard closes."""


class SinkSet:
    """Calls every sink; a sink that raises is reported once and then left out."""

    def __init__(self, sinks: Iterable[Sink] = ()) -> None:
        self.sinks: list[Sink] = list(sinks)
        self.failures: dict[str, str] = {}

    def _call(self, method: str, *args: object) -> None:
        for sink in list(self.sinks):
            try:
                getattr(sink, method)(*args)
            except Exception as exc:  # a monitoring bug must not kill the run
                name = type(sink).__name__
                self.failures[name] = f"{type(exc).__name__}: {exc}"
                self.sinks.remove(sink)
                log.error("trainguard: sink %s failed in %s (%s) and was disabled; training "
                          "goes on", name, method, self.failures[name])

    def on_event(self, event: Event) -> None:
        self._call("on_event", event)

    def on_step(self, report: StepReport) -> None:
        self._call("on_step", report)

    def close(self) -> None:
        self._call("close")
