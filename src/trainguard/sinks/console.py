"""Prints events as they happen, on stderr, one line each."""

from __future__ import annotations

import sys
from typing import TextIO

from trainguard.events import Event
from trainguard.sinks.base import Sink

_COLOURS = {"info": "36", "warning": "33", "error": "31", "critical": "1;31"}


class ConsoleSink(Sink):
    def __init__(self, stream: TextIO | None = None, *, colour: bool | None = None) -> None:
        self.stream = stream
        self.colour = colour

    def on_event(self, event: Event) -> None:
        stream = self.stream or sys.stderr
        colour = self.colour if self.colour is not None else stream.isatty()
        text = f"trainguard {event}"
        if colour:
            text = f"\033[{_COLOURS.get(event.severity, '0')}m{text}\033[0m"
        print(text, file=stream, flush=True)
