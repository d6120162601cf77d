"""`trainguard analyze` of a run store says what the run's own verdict says (`trainguard show`):
the live run judged itself from more than its store can replay."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

import trainguard
from trainguard import Guard, GuardConfig
from trainguard.analyze import analyze
from trainguard.analyze.analysis import analyze_log
from trainguard.analyze.log import LOSS, Log
from trainguard.events import Event

from ..conftest import make_setup


def lr_burst_run(run_dir: Path, *, lr: float, seed: int, start: int, length: int) -> None:
    """A plain loop under the default policy whose user multiplies the LR by 100 at `start`
    and restores it `length` steps later."""
    setup = make_setup(lr=lr, warmup=0, seed=seed)
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(sinks={"console": False}),
                  run_dir=run_dir)
    for step in range(200):
        if step in (start, start + length):
            for group in setup.optimizer.param_groups:
                group["lr"] *= 100 if step == start else 1 / 100
        batch = setup.batch()
        loss = setup.model.loss(batch)
        setup.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        guard.step(loss, batch=batch)
    guard.close()


@pytest.mark.parametrize("lr, seed, start, length, live", [
    (3e-4, 1, 100, 3, "recovered"),  # its trouble: an Adam-ratio warning the store cannot replay
    (1e-3, 0, 100, 3, "degraded"),  # the replay's level before the trouble is of another window
])
def test_analyze_of_a_store_says_the_runs_own_verdict(tmp_path: Path, lr: float, seed: int,
                                                      start: int, length: int,
                                                      live: str) -> None:
    run_dir = tmp_path / "run"
    lr_burst_run(run_dir, lr=lr, seed=seed, start=start, length=length)
    with trainguard.RunReader(run_dir) as reader:
        own = reader.meta()["verdict"]
    assert own["verdict"] == live
    result = analyze(run_dir)
    assert result.verdict == live, result.evidence
    assert result.onset_step is not None and result.onset_step >= start
    assert any(line.startswith("the run's own verdict at its close") for line in result.evidence)


def rows_log(own: dict | None, events: list[Event] | None = None) -> Log:
    """A store's reading of a run whose loss falls smoothly: the replay sees no trouble."""
    losses = [3.0 * math.exp(-i / 60) + 1.0 for i in range(200)]
    return Log(path="run", format="store", steps=list(range(200)), series={LOSS: losses},
               own_verdict=own, own_events=events or [])


def test_trouble_only_the_live_run_saw_is_told_from_its_own_events() -> None:
    warning = Event(kind="instability_precursor", step=120, severity="warning",
                    message="log Z of the output logits at 9.8, rising")
    own = {"verdict": "recovered", "message": "the loss ended at 1.1, no worse than the 1.3 it "
           "was before the first trouble (step 120)", "trouble_step": 120}
    result = analyze_log(rows_log(own, [warning]))
    assert (result.verdict, result.kind, result.onset_step) == ("recovered", None, 120)
    assert result.evidence[0].startswith("step 120: instability_precursor")


def test_a_stalled_run_keeps_the_replays_verdict_and_tells_its_own() -> None:
    own = {"verdict": "stalled", "message": "the loss never came down in 200 steps"}
    result = analyze_log(rows_log(own))
    assert result.verdict == "healthy"
    assert "stalled: the loss never came down" in result.evidence[0]


def test_a_log_without_a_verdict_of_its_own_is_judged_by_the_replay_alone() -> None:
    result = analyze_log(rows_log(None))
    assert result.verdict == "healthy"
    assert not [line for line in result.evidence if "own verdict" in line]


def test_a_store_verdict_with_levels_that_are_not_numbers_is_read_without_them(
        tmp_path: Path) -> None:
    """A store is untrusted input: a verdict whose levels or trouble step are not what the live
    verdict writes is read for its word and message only."""
    run_dir = tmp_path / "run"
    setup = make_setup(warmup=0)
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(sinks={"console": False}),
                  run_dir=run_dir)
    for _ in range(5):
        batch = setup.batch()
        loss = setup.model.loss(batch)
        setup.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        guard.step(loss, batch=batch)
    guard.close()
    with sqlite3.connect(run_dir / "trainguard.db") as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'verdict'", (json.dumps(
            {"verdict": "degraded", "message": "forged", "final": "high", "trouble_step": 2.5,
             "before_trouble": True}),))
    result = analyze(run_dir)
    assert result.verdict == "degraded"
    assert result.log is not None and result.log.own_verdict == {"verdict": "degraded",
                                                                 "message": "forged"}
