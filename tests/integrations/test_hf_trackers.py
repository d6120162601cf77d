"""The Hugging Face Trainer with `report_to=["wandb"]` and `["mlflow"]`: trainguard reports into
the tracker's run, on its `train/global_step` axis, with no sink given."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from transformers import Trainer

from trainguard import GuardConfig
from trainguard.hf import TrainguardCallback

from ..tracker_runs import is_nan, number, wandb_records
from .test_hf import PoisonForward, Recorder, make_args, tiny_gpt2, token_data

pytestmark = pytest.mark.slow
QUIET = {"sinks": {"console": False}}
NAN_AT = 5
"""The optimizer step (0-based) whose forward pass is poisoned: the Trainer's global_step 6."""


def _train(tmp_path: Path, report_to: str) -> tuple[TrainguardCallback, Recorder]:
    model = tiny_gpt2()
    PoisonForward(model.transformer.wte, at={NAN_AT})
    recorder = Recorder()
    callback = TrainguardCallback(GuardConfig(**QUIET), sinks=[recorder])
    trainer = Trainer(model=model, args=make_args(tmp_path, report_to=[report_to]),
                      train_dataset=token_data(), callbacks=[callback])
    trainer.train()
    return callback, recorder


def test_report_to_wandb_puts_trainguard_on_the_trainers_step_axis(
        wandb_offline: Path, tmp_path: Path) -> None:
    import wandb

    callback, recorder = _train(tmp_path, "wandb")
    tracker = wandb.run
    assert tracker is not None
    run_dir = Path(tracker.dir).parent
    tracker.finish()
    records = wandb_records(run_dir)

    axis = "train/global_step"
    assert [row[axis] for row in records.rows_with("trainguard/grad_norm")] == list(range(1, 9))
    # the loss the Trainer logged at a global step is trainguard's loss there
    assert len(records.rows_with("train/loss")) == 8
    for row in records.rows_with("train/loss"):
        step = row[axis]
        if step != NAN_AT + 1:
            assert number(records.at(axis, step, "trainguard/loss")) == pytest.approx(
                number(row["train/loss"]), abs=1e-3)
    assert is_nan(records.at(axis, NAN_AT + 1, "trainguard/loss"))
    assert number(records.at(axis, NAN_AT + 1, "trainguard/skipped")) == 1
    assert number(records.at(axis, NAN_AT + 1, "trainguard/events/error")) >= 1
    assert any(a["title"] == "trainguard: nonfinite_loss" and f"step {NAN_AT + 1}" in a["text"]
               for a in records.alerts)
    assert callback.run is not None and callback.run.verdict is not None
    assert records.summary["trainguard/verdict"] == (callback.run.verdict.verdict
                                                     or "not judged")
    codes = [c.code for c in callback.run.diagnose()]
    assert records.summary["trainguard/causes"] == ", ".join(codes)
    assert recorder.reports[NAN_AT].action == "skipped"


def test_report_to_mlflow_puts_trainguard_at_the_trainers_global_step(
        mlflow_store: str, tmp_path: Path) -> None:
    import mlflow

    callback, _ = _train(tmp_path, "mlflow")
    client = mlflow.MlflowClient()
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              order_by=["attributes.start_time DESC"], max_results=1)
    run_id = runs[0].info.run_id

    def history(key: str) -> dict[int, float]:
        return {m.step: m.value for m in client.get_metric_history(run_id, key)}

    ours, theirs = history("trainguard/loss"), history("loss")
    assert sorted(ours) == list(range(1, 9))
    assert math.isnan(ours[NAN_AT + 1])
    assert len(theirs) >= 7
    for step, loss in theirs.items():
        if step != NAN_AT + 1:
            assert ours[step] == pytest.approx(loss, abs=1e-3)
    assert list(history("trainguard/events/error")) == [NAN_AT + 1]
    tags = client.get_run(run_id).data.tags
    assert callback.run is not None and callback.run.verdict is not None
    assert tags["trainguard/verdict"] == (callback.run.verdict.verdict or "not judged")
    assert tags["trainguard/causes"] == ", ".join(c.code for c in callback.run.diagnose())
