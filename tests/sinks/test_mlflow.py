"""MlflowSink on a real local MLflow store (sqlite), read back with `MlflowClient`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainguard.sinks import MlflowSink

from ..conftest import Actions
from .conftest import guarded_run, run_steps

pytestmark = pytest.mark.slow
NAN_AT = 5


def test_an_active_run_gets_the_nan_step_its_event_the_verdict_and_the_causes(
        mlflow_store: str, tmp_path: Path) -> None:
    import mlflow

    with mlflow.start_run() as active:
        run = guarded_run(run_dir=tmp_path / "store")
        run_steps(run, 12, nan_at=NAN_AT)
        run.guard.close()
    client, run_id = mlflow.MlflowClient(), active.info.run_id

    def history(key: str) -> dict[int, float]:
        return {m.step: m.value for m in client.get_metric_history(run_id, key)}

    losses = history("trainguard/loss")
    assert sorted(losses) == list(range(12))
    assert math.isnan(losses[NAN_AT])
    assert losses[4] == pytest.approx(run.reports[4].loss)
    assert history("trainguard/nonfinite/loss")[NAN_AT] == 1
    assert history("trainguard/nonfinite/loss")[4] == 0
    assert history("trainguard/skipped")[NAN_AT] == 1
    assert list(history("trainguard/events/error")) == [NAN_AT]
    assert 3 in history("trainguard/layers/grad_norm/body.0.weight")
    tags = client.get_run(run_id).data.tags
    assert tags["trainguard/verdict"] == (run.guard.run.verdict.verdict or "not judged")
    causes = run.guard.run.diagnose()
    assert tags["trainguard/cause/1"].startswith(causes[0].code)
    assert tags["trainguard/status"] == "finished"
    assert tags["trainguard/last_event"].startswith(f"step {NAN_AT}: error")
    files = {a.path for a in client.list_artifacts(run_id, "trainguard")}
    assert files == {"trainguard/events.json", "trainguard/trainguard-report.html"}
    table = json.loads(Path(client.download_artifacts(run_id, "trainguard/events.json",
                                                      str(tmp_path))).read_text())
    assert [NAN_AT, "error", "nonfinite_loss"] in [row[:3] for row in table["data"]]


def test_the_run_is_found_and_said_once_and_the_config_turns_it_off(mlflow_store: str) -> None:
    import mlflow

    with mlflow.start_run() as active:
        actions = Actions()
        run = guarded_run([actions])
        run_steps(run, 3)
        run.guard.close()
        said = [a for a in actions.actions if a.kind == "report_to"]
        assert len(said) == 1 and active.info.run_id in said[0].message
        off = guarded_run(sinks={"console": False, "trackers": False})
        assert not any(isinstance(s, MlflowSink) for s in off.guard.run.sinks.sinks)
        off.guard.close()
    # no active run and no hint: nothing is looked for, nothing is said
    quiet = Actions()
    alone = guarded_run([quiet])
    alone.guard.close()
    assert not any(isinstance(s, MlflowSink) for s in alone.guard.run.sinks.sinks)
    assert not [a for a in quiet.actions if a.kind == "report_to"]


def test_keys_that_mlflow_refuses_are_made_valid(mlflow_store: str) -> None:
    import mlflow
    from torch import nn

    from trainguard import Guard, GuardConfig

    class Odd(nn.Module):  # parameter names with characters MLflow refuses in a key
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleDict({"a@b": nn.Linear(2, 2), "c#d": nn.Linear(2, 1)})

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.layers["c#d"](self.layers["a@b"](x))

    import torch

    model = Odd()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with mlflow.start_run() as active:
        sink = MlflowSink()
        guard = Guard(model, optimizer, sinks=[sink],
                      config=GuardConfig(sinks={"console": False}, probes={"sample_every": 1}))
        for _ in range(3):
            loss = model(torch.ones(4, 2)).pow(2).mean()
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad()
        guard.close()
    assert sink.failed is None
    keys = set(mlflow.MlflowClient().get_run(active.info.run_id).data.metrics)
    assert "trainguard/layers/grad_norm/layers.a_b.weight" in keys


def test_while_no_run_has_started_the_newest_points_are_kept_and_sent_when_it_starts(
        mlflow_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    from trainguard.events import RunInfo, StepReport
    from trainguard.sinks import mlflow as mlflow_sink

    monkeypatch.setattr(mlflow_sink, "WAITING_POINTS", 40)  # a small bound, to fill it quickly
    sink = MlflowSink(flush_s=0.0)
    sink.on_run_start(RunInfo(run_dir=None, config={}, param_names=[], param_shapes=[],
                              trainguard_version="0"))
    for step in range(20):  # 4 points a step (grad_norm, clip_coef, skipped, a count)
        sink.on_step(StepReport(step=step, loss=None, grad_norm=float(step), action="applied"))
    assert sink.run_id is None and sink.waiting_dropped == 80 - 40
    with mlflow.start_run() as active:
        sink.on_step(StepReport(step=20, loss=None, grad_norm=20.0, action="applied"))
        sink.close()
    history = mlflow.MlflowClient().get_metric_history(active.info.run_id, "trainguard/grad_norm")
    assert sorted(m.step for m in history) == list(range(10, 21))
