"""Runs that never learn: the verdict says `stalled`, not `recovered`, and the stall is named."""

from __future__ import annotations

from benchmarks.scenarios import scenario
from benchmarks.scenarios.runner import run_scenario


def test_an_lr_far_too_low_stalls_and_is_named() -> None:
    result = run_scenario(scenario("gpt2_lr_too_low"), "trainguard")
    assert result.verdict == "stalled"
    assert [e["kind"] for e in result.events] == ["no_progress"]
    assert result.diagnosis[0] == "lr_too_low"


def test_the_healthy_runs_of_the_family_are_not_stalled() -> None:
    for name in ("gpt2_healthy", "gpt2_lora_healthy"):
        result = run_scenario(scenario(name), "trainguard")
        assert result.verdict == "healthy" and result.false_alarms == 0, name
