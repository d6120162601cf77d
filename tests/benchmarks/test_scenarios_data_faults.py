"""Data faults that last or come in runs: ground truth on the unguarded run, and the batches of a
bad shard named. Whether each is caught and its cause named is a row of
`test_scenario_families.py`'s table."""

from __future__ import annotations

import pytest
from benchmarks.scenarios import scenario
from benchmarks.scenarios.runner import run_scenario


@pytest.mark.parametrize("name", ["regression_input_scale_drift", "regression_bad_shard"])
def test_the_fault_really_hurts_an_unguarded_run(name: str) -> None:
    healthy = run_scenario(scenario("regression_healthy_student_t"), "none")
    unguarded = run_scenario(scenario(name), "none")
    assert unguarded.final_eval_loss > 1.1 * healthy.final_eval_loss


def test_a_10_batch_bad_shard_is_the_data_and_its_batches_are_named() -> None:
    result = run_scenario(scenario("regression_bad_shard"), "trainguard")
    assert result.detected and result.latency == 0
    assert result.diagnosis[0] == "outlier_batch"
    [run] = [f for f in result.findings if f["check"] == "batch_run"]
    assert run["message"].startswith("10 consecutive batches (steps 100-109, data ids 100-109) "
                                     "had batch_outlier on 'x'")
