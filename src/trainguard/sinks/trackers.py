"""Finding the experiment trackers a run already reports to, so that trainguard reports there
too without extra code: an active W&B run (`wandb.run`), an active MLflow run
(`mlflow.active_run()`), a Lightning `WandbLogger` or `MLFlowLogger` among the trainer's
loggers, or a Hugging Face `report_to` that names "wandb" or "mlflow" (the tracker's run is then
found when it starts). `GuardConfig(sinks={"trackers": False})` turns it off.

Nothing here imports a tracker: one the process never imported has no active run, and a run
without trackers pays nothing for this.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.sinks.base import Sink

log = logging.getLogger("trainguard")

WANDB, MLFLOW = "wandb", "mlflow"


@dataclass(frozen=True, slots=True)
class TrackerHints:
    """What a trainer says of its trackers: the Hugging Face `report_to` names, Lightning's
    loggers."""

    report_to: tuple[str, ...] = ()
    loggers: tuple[Any, ...] = ()

    @classmethod
    def of(cls, report_to: str | Sequence[str] | None = None,
           loggers: Iterable[Any] = ()) -> TrackerHints:
        names = [report_to] if isinstance(report_to, str) else list(report_to or ())
        if "all" in names:  # the Trainer's "all": every installed integration
            names = [WANDB, MLFLOW]
        return cls(tuple(str(n).lower() for n in names), tuple(loggers))


@dataclass(frozen=True, slots=True)
class Found:
    """A tracker sink made for a run found active, and how to say so."""

    sink: Sink
    tracker: str
    where: str


def _logger_of(loggers: Iterable[Any], class_name: str) -> Any:
    return next((lg for lg in loggers if type(lg).__name__ == class_name), None)


def _wandb(hints: TrackerHints) -> Found | None:
    from trainguard.sinks.wandb import WandbSink

    logger = _logger_of(hints.loggers, "WandbLogger")
    if logger is not None:
        run = logger.experiment  # the logger's own run (it starts it if it has not yet)
        return Found(WandbSink(run), WANDB, f"the W&B run {run.name or run.id} of the WandbLogger")
    module = sys.modules.get("wandb")
    run = getattr(module, "run", None) if module is not None else None
    if run is not None:
        return Found(WandbSink(), WANDB, f"the active W&B run {run.name or run.id}")
    if WANDB in hints.report_to:
        return Found(WandbSink(), WANDB, "the W&B run that report_to starts")
    return None


def _mlflow(hints: TrackerHints) -> Found | None:
    from trainguard.sinks.mlflow import MlflowSink

    logger = _logger_of(hints.loggers, "MLFlowLogger")
    if logger is not None:
        run_id = logger.run_id  # the logger's own run (it starts it if it has not yet)
        return Found(MlflowSink(run_id=run_id, client=logger.experiment),
                     MLFLOW, f"the MLflow run {run_id} of the MLFlowLogger")
    module = sys.modules.get("mlflow")
    active = module.active_run() if module is not None else None
    if active is not None:
        return Found(MlflowSink(), MLFLOW, f"the active MLflow run {active.info.run_id}")
    if MLFLOW in hints.report_to:
        return Found(MlflowSink(), MLFLOW, "the MLflow run that report_to starts")
    return None


def find_trackers(given: Iterable[Sink], hints: TrackerHints | None = None) -> list[Found]:
    """A sink for each tracker the run reports to and no sink in `given` already covers."""
    from trainguard.sinks.mlflow import MlflowSink
    from trainguard.sinks.wandb import WandbSink

    hints = hints or TrackerHints()
    given = list(given)
    found: list[Found] = []
    for kind, finder in ((WandbSink, _wandb), (MlflowSink, _mlflow)):
        if any(isinstance(sink, kind) for sink in given):
            continue
        try:
            tracker = finder(hints)
        except Exception as exc:  # one tracker's trouble leaves the other and training alone
            log.warning("trainguard: could not report to %s (%s: %s); training goes on "
                        "without it", kind.__name__, type(exc).__name__, exc)
            continue
        if tracker is not None:
            found.append(tracker)
    return found
