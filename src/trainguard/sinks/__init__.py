"""Sinks record what the Guard sees. A failing sink is reported once and disabled, never fatal."""

from trainguard.sinks.base import Sink, SinkSet
from trainguard.sinks.console import ConsoleSink

__all__ = ["ConsoleSink", "Sink", "SinkSet"]
