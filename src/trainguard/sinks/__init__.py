"""Sinks record what the Guard sees. A failing sink is reported once and disabled, never fatal.

`TensorBoardSink` and `PrometheusSink` import their packages (the `tensorboard` and `prometheus`
extras) only when one is made."""

from trainguard.sinks.base import Sink, SinkSet
from trainguard.sinks.console import ConsoleSink
from trainguard.sinks.prometheus import PrometheusSink
from trainguard.sinks.tensorboard import TensorBoardSink

__all__ = ["ConsoleSink", "PrometheusSink", "Sink", "SinkSet", "TensorBoardSink"]
