"""The ddp family on two real gloo ranks: in-sync replicas converge, a desync drifts apart."""

from __future__ import annotations

import pytest
from benchmarks.scenarios.families import ddp
from benchmarks.scenarios.runner import run_scenario

from trainguard import GuardConfig

STEPS = 60
"""Enough for the healthy loss to fall far, for the desync (from step 20) to show, and for the
Guard's cross-rank check (every `desync_every` = 50 steps) to run after it."""


@pytest.fixture(scope="module")
def by_name() -> dict:
    return {s.name: s for s in ddp.scenarios()}


def test_healthy_ranks_stay_identical_and_converge(by_name: dict) -> None:
    result = run_scenario(by_name["ddp_healthy"], "trainguard", steps=STEPS)
    assert result.outcome == "finished", result.error
    assert result.events == []
    assert result.final_eval_loss < 0.3 * result.notes["initial_eval_loss"]
    assert set(result.notes["replica_drift"].values()) == {0.0}
    assert result.notes["param_checksum_spread"] == 0.0
    assert [r["eval_loss"] for r in result.notes["ranks"]] == [result.final_eval_loss] * 2


def test_desync_drifts_apart_unseen_by_each_rank(by_name: dict) -> None:
    scenario = by_name["ddp_desync"]
    result = run_scenario(scenario, "trainguard", steps=STEPS,
                          config=GuardConfig(policy="observe", sinks={"console": False}))
    assert result.outcome == "finished", result.error
    drift = result.notes["replica_drift"]
    assert drift[scenario.onset_step] == 0.0  # in sync until the backbone is unfrozen
    assert drift[STEPS] > 0.05 and drift[STEPS] > drift[scenario.onset_step + 10] > 0.0
    # Each rank's own loss keeps falling, so a single-rank view has nothing to flag; the Guard's
    # cross-rank fingerprint, riding every 5th step's all-reduce, names the drifting backbone at
    # its first check after the onset (the unfreezing itself is named, as information).
    assert result.detected is True
    assert [(e["kind"], e["step"]) for e in result.events] == [
        ("params_unfrozen", scenario.onset_step), ("ddp_desync", scenario.onset_step + 5)]
    assert result.diagnosis[:1] == ["ddp_desync"]
    assert result.train_losses[-1] < 0.3 * result.train_losses[0]
    # Rank 0 has lost the other rank's domain.
    assert result.final_eval_loss > 2.0


def test_under_protect_the_desync_halts_both_ranks_within_5_steps(by_name: dict) -> None:
    scenario = by_name["ddp_desync"]
    result = run_scenario(scenario, "trainguard", steps=STEPS)
    assert result.outcome == "halted"
    # its first check after the onset (the unfreezing itself is named, as information).
    assert [(e["kind"], e["step"]) for e in result.events] == [
        ("params_unfrozen", scenario.onset_step), ("ddp_desync", scenario.onset_step + 5)]
