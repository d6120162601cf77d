"""Sinks record what the Guard sees. A failing sink is reported once and disabled, never fatal.

`TensorBoardSink`, `PrometheusSink`, `WandbSink` and `MlflowSink` import their packages (the
`tensorboard`, `prometheus`, `wandb` and `mlflow` extras) only when one is made."""

from trainguard.sinks.base import Sink, SinkSet
from trainguard.sinks.console import ConsoleSink
from trainguard.sinks.mlflow import MlflowSink
from trainguard.sinks.prometheus import PrometheusSink
from trainguard.sinks.tensorboard import TensorBoardSink
from trainguard.sinks.wandb import WandbSink

__all__ = ["ConsoleSink", "MlflowSink", "PrometheusSink", "Sink", "SinkSet", "TensorBoardSink",
           "WandbSink"]
