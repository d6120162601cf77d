"""A tracker that raises on every call never fails the run: the weights end as an unguarded
run's, and the sink says why once."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from trainguard import Guard, GuardConfig
from trainguard.pipeline.run import Run
from trainguard.sinks import MlflowSink, Sink, WandbSink
from trainguard.sinks.trackers import TrackerHints

from ..tracker_runs import wandb_records
from .conftest import TinyNet

pytestmark = pytest.mark.slow
STEPS = 8


def _weights_after(sink: Sink | None) -> list[torch.Tensor]:
    """A short healthy run under `observe` (which changes nothing), guarded with `sink`, or
    with no Guard at all when `sink` is None."""
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = None if sink is None else Guard(
        model, optimizer, sinks=[sink],
        config=GuardConfig(policy="observe", sinks={"console": False},
                           probes={"sample_every": 2}))
    generator = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randn(16, 4, generator=generator)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        loss.backward()
        if guard is None:
            optimizer.step()
        else:
            guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    if guard is not None:
        guard.close()
    return [p.detach().clone() for p in model.parameters()]


def _finished_wandb_run(folder: Path) -> Sink:
    import wandb

    run = wandb.init(mode="offline", dir=str(folder))
    run.finish()  # every call on a finished run raises
    return WandbSink(run)


def _missing_mlflow_run(uri: str) -> Sink:
    import mlflow

    return MlflowSink("0" * 32, client=mlflow.MlflowClient(uri))  # no such run: every call raises


BROKEN: dict[str, tuple[Callable[..., Sink], str]] = {
    "wandb": (_finished_wandb_run, "wandb_offline"),
    "mlflow": (_missing_mlflow_run, "mlflow_uri"),
}
"""Each tracker broken for real, and the fixture its store comes from."""


@pytest.mark.parametrize("tracker", sorted(BROKEN))
def test_a_tracker_raising_on_every_call_is_one_warning_and_changes_no_weight(
        tracker: str, request: pytest.FixtureRequest,
        caplog: pytest.LogCaptureFixture) -> None:
    make, store = BROKEN[tracker]
    sink = make(request.getfixturevalue(store))
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        guarded = _weights_after(sink)
    unguarded = _weights_after(None)
    assert all(torch.equal(a, b) for a, b in zip(guarded, unguarded, strict=True))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert f"{type(sink).__name__} failed" in warnings[0]
    assert sink.failed is not None  # type: ignore[attr-defined]


def test_report_to_names_a_tracker_whose_run_starts_after_trainguard(
        wandb_offline: Path) -> None:
    """The sink waits for the run a trainer's tracker starts, and reports there from then."""
    import wandb

    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    run = Run(model, optimizer, config=GuardConfig(sinks={"console": False}),
              trackers=TrackerHints.of(["wandb"]))
    sinks = [s for s in run.sinks.sinks if isinstance(s, WandbSink)]
    assert len(sinks) == 1 and sinks[0].run is None
    tracker = wandb.init(mode="offline")
    x = torch.ones(4, 4)
    for _ in range(3):
        loss = model(x).pow(2).mean()
        loss.backward()
        ctx = run.before_update(loss)
        optimizer.step()
        run.after_update(ctx)
        optimizer.zero_grad()
    run.close()
    assert sinks[0].run is tracker
    run_dir = Path(tracker.dir).parent
    tracker.finish()
    steps = [row["trainguard/step"] for row in wandb_records(run_dir).rows_with(
        "trainguard/grad_norm")]
    assert steps == [0, 1, 2]
