"""`benchmarks/stage_profile.py` times every stage of a guarded step, and the step stays guarded."""

from __future__ import annotations

import logging

import pytest
from benchmarks.stage_profile import STAGE_BUDGETS_US, budgets, profile

from trainguard.detect import DETECTOR_TYPES


@pytest.mark.parametrize("sync", ["blocking", "deferred"])
def test_every_stage_is_timed_and_the_steps_stay_guarded(sync: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    # the timer hands each stage's result on: a wrapper that dropped it left the later stages
    # without their input, and every step was applied unguarded
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        result = profile("mlp", blocks=1, steps=3, sync=sync)
    assert "could not check" not in caplog.text
    stages = {"measure", "detect", "decide", "act", "settle"} if sync == "blocking" else {
        "detect", "decide", "act_late"}
    assert stages <= set(result), sorted(result)
    assert result["(whole step)"] > 0


def test_each_detector_is_timed_on_either_clock() -> None:
    for clock in ("wall", "thread"):
        result = profile("mlp", blocks=1, steps=3, clock=clock)
        timed = {name for name in result if name.startswith("detector:")}
        assert {"detector:instability_precursor", "detector:grad_explosion"} <= timed, clock
        assert all(result[name] >= 0 for name in timed)


def test_every_stage_and_detector_states_a_budget_and_is_measured_against_it() -> None:
    assert all(d.budget_us > 0 for d in DETECTOR_TYPES)
    result = profile("mlp", blocks=1, steps=3, clock="thread")
    judged = {name for name, _, _ in budgets(result)}
    assert set(STAGE_BUDGETS_US) <= judged | {"explain"}
    assert {f"detector:{d.kind}" for d in DETECTOR_TYPES} <= judged
