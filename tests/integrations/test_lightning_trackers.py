"""Lightning with a `WandbLogger` or an `MLFlowLogger`: trainguard reports into the logger's
run, on its `trainer/global_step` axis, with no sink given."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

from trainguard import GuardConfig
from trainguard.lightning import TrainguardCallback

from ..tracker_runs import is_nan, number, wandb_records
from .test_lightning import loader, make_trainer, pl  # noqa: F401  (pl: a fixture)

pytestmark = pytest.mark.slow
QUIET = {"sinks": {"console": False}}
NAN_AT = 5


def logging_module(pl: ModuleType) -> Any:  # noqa: F811
    """A small regression that logs its loss each step; its 6th step's loss is NaN."""

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
            self.steps = 0

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            if self.steps == NAN_AT:
                loss = loss * float("nan")
            self.steps += 1
            self.log("train_loss", loss, on_step=True, on_epoch=False)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    return Regression()


def _fit(pl: ModuleType, tmp_path: Path, logger: Any) -> TrainguardCallback:  # noqa: F811
    callback = TrainguardCallback(GuardConfig(**QUIET))
    trainer = make_trainer(pl, tmp_path, callback, logger=logger, log_every_n_steps=1)
    trainer.fit(logging_module(pl), loader())
    return callback


def test_a_wandb_logger_gets_trainguard_on_its_step_axis(
        pl: ModuleType, wandb_offline: Path, tmp_path: Path) -> None:  # noqa: F811
    logger = pl.loggers.WandbLogger(offline=True, save_dir=str(wandb_offline))
    callback = _fit(pl, tmp_path, logger)
    tracker = logger.experiment
    run_dir = Path(tracker.dir).parent
    tracker.finish()
    records = wandb_records(run_dir)

    axis = "trainer/global_step"
    assert [row[axis] for row in records.rows_with("trainguard/grad_norm")] == list(range(8))
    logged = records.rows_with("train_loss")
    assert len(logged) >= 7
    for row in logged:  # the module's own loss at a step is trainguard's loss there
        if row[axis] != NAN_AT:
            assert number(records.at(axis, row[axis], "trainguard/loss")) == pytest.approx(
                number(row["train_loss"]), rel=1e-5)
    assert is_nan(records.at(axis, NAN_AT, "trainguard/loss"))
    assert number(records.at(axis, NAN_AT, "trainguard/events/error")) >= 1
    assert any(a["title"] == "trainguard: nonfinite_loss" and f"step {NAN_AT}" in a["text"]
               for a in records.alerts)
    assert callback.run is not None and callback.run.verdict is not None
    assert records.summary["trainguard/verdict"] == (callback.run.verdict.verdict
                                                     or "not judged")
    assert records.summary["trainguard/causes"] == ", ".join(
        c.code for c in callback.run.diagnose())


def test_an_mlflow_logger_gets_trainguard_at_its_steps(
        pl: ModuleType, mlflow_store: str, tmp_path: Path) -> None:  # noqa: F811
    import mlflow

    logger = pl.loggers.MLFlowLogger(experiment_name=f"trainguard-{pl.__name__}",
                                     tracking_uri=mlflow_store,
                                     artifact_location=(tmp_path / "mlflow").as_uri())
    callback = _fit(pl, tmp_path, logger)
    client = mlflow.MlflowClient(mlflow_store)

    def history(key: str) -> dict[int, float]:
        return {m.step: m.value for m in client.get_metric_history(logger.run_id, key)}

    ours, theirs = history("trainguard/loss"), history("train_loss")
    assert sorted(ours) == list(range(8))
    assert len(theirs) >= 7
    for step, loss in theirs.items():
        if step != NAN_AT:
            assert ours[step] == pytest.approx(loss, rel=1e-5)
    assert math.isnan(ours[NAN_AT])
    assert list(history("trainguard/events/error")) == [NAN_AT]
    tags = client.get_run(logger.run_id).data.tags
    assert callback.run is not None and callback.run.verdict is not None
    assert tags["trainguard/verdict"] == (callback.run.verdict.verdict or "not judged")
    assert tags["trainguard/causes"] == ", ".join(c.code for c in callback.run.diagnose())
