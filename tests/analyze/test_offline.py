"""The offline replay runs the live detectors: over a trainguard store of a real guarded run it
raises the events the live run raised (those a log can hold), at the same steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import trainguard
from trainguard import Guard, GuardConfig
from trainguard.analyze import analyze
from trainguard.events import Event

SAMPLED_ONLY = {"nonfinite_weight", "dead_units", "extreme_weight", "nonfinite_optimizer_state",
                "output_collapse", "no_progress"}
"""Event kinds raised from heavy-probe statistics only: a log holds none of them (and the stall,
judged on a live run from its start only)."""
FROM_LOGS_ONLY = {"loss_at_chance", "loss_above_chance", "nonfinite_value"}
"""Judged from a log's loss level (`analyze/chance.py`) or, in a log without a loss, from its
other values (`analyze/lossless.py`), not by a live detector."""


def _faulty_run(run_dir: Path) -> list[Event]:
    """A protected regression whose user raises the LR at step 60 (explosion, then NaN) and feeds
    one NaN batch at step 30: the events the live run raised."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    guard = Guard(model, optimizer, config=GuardConfig(policy="protect", sinks={"console": False},
                                                       probes={"preflight": False}),
                                                       run_dir=run_dir)
    generator = torch.Generator().manual_seed(1)
    for step in range(110):
        if step == 60:
            for group in optimizer.param_groups:
                group["lr"] = 3.0
        x = torch.randn(32, 8, generator=generator)
        if step == 30:
            x[0, 0] = float("nan")
        loss = nn.functional.mse_loss(model(x), x[:, :1] * 2)
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    return list(guard.events)


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Event]]:
    run_dir = tmp_path_factory.mktemp("analyze") / "run"
    return run_dir, _faulty_run(run_dir)


def test_the_replayed_events_are_the_live_runs(faulty: tuple[Path, list[Event]]) -> None:
    """Live, a jump is an outlier batch until the next step, where it is told again if it did
    not come back; the replay, which judges with the whole log in view, folds the two into the
    jump itself, at the severity of its size."""
    run_dir, events = faulty
    offline = analyze(run_dir)
    assert offline.format == "store"
    assert any("jump_step" in e.details for e in events)  # the live run told a jump again
    live = [(e.kind, e.step) for e in events if "jump_step" not in e.details]
    expected = sorted((kind, step) for kind, step in live if kind not in SAMPLED_ONLY)
    replayed = sorted((e.kind, e.step) for e in offline.events
                      if e.kind not in FROM_LOGS_ONLY)
    assert {"nonfinite_loss", "nonfinite_grad", "lr_change", "grad_explosion",
            "loss_spike"} <= {kind for kind, _ in expected}, live
    assert replayed == expected


def test_the_stored_events_are_the_live_ones(faulty: tuple[Path, list[Event]]) -> None:
    run_dir, events = faulty
    stored = [(e.kind, e.step) for e in trainguard.RunReader(run_dir).events()]
    assert sorted(stored) == sorted((e.kind, e.step) for e in events)


def test_the_run_is_judged_from_the_incident_it_never_came_back_from(
        faulty: tuple[Path, list[Event]]) -> None:
    """protect skipped the NaN batch of step 30 and the run came back; the LR raised to 3 at step
    60 broke it for good (its loss ends thousands of times higher): that incident decides the
    verdict, its kind and its onset, and the NaN step is told as an earlier, recovered one."""
    run_dir, _ = faulty
    result = analyze(run_dir)
    assert result.verdict == "degraded"
    assert (result.kind, result.onset_step) == ("explosion", 61)
    assert result.judgement is not None
    assert {e.step for e in result.judgement.earlier} == {30}
    assert any("earlier" in line and "step 30" in line for line in result.evidence)
    assert result.causes, "a run in trouble gets ranked causes"
