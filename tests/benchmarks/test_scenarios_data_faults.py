"""Data faults that last or come in runs, and labels that leave the loss nothing to average: the
data (or the labels) first in the diagnosis, not the learning rate."""

from __future__ import annotations

import pytest
from benchmarks.scenarios import scenario
from benchmarks.scenarios.runner import run_scenario


@pytest.mark.parametrize("name", ["regression_input_scale_drift", "regression_bad_shard"])
def test_the_fault_really_hurts_an_unguarded_run(name: str) -> None:
    healthy = run_scenario(scenario("regression_healthy_student_t"), "none")
    unguarded = run_scenario(scenario(name), "none")
    assert unguarded.final_eval_loss > 1.1 * healthy.final_eval_loss


@pytest.mark.parametrize("strategy", ["trainguard", "recover"])
def test_inputs_1e4x_larger_from_step_100_on_are_a_change_of_scale(strategy: str) -> None:
    result = run_scenario(scenario("regression_input_scale_drift"), strategy)
    assert result.detected and result.latency == 0 and result.false_alarms == 0
    assert result.diagnosis[0] == "input_scale"


def test_a_10_batch_bad_shard_is_the_data_and_its_batches_are_named() -> None:
    result = run_scenario(scenario("regression_bad_shard"), "trainguard")
    assert result.detected and result.latency == 0
    assert result.diagnosis[0] == "outlier_batch"
    [run] = [f for f in result.findings if f["check"] == "batch_run"]
    assert run["message"].startswith("10 consecutive batches (steps 100-109, data ids 100-109) "
                                     "had batch_outlier on 'x'")


def test_labels_all_ignored_are_the_labels_not_a_numerical_op() -> None:
    s = scenario("lstm_labels_ignored")
    result = run_scenario(s, "trainguard", steps=s.onset_step + 5)
    assert result.detected and result.latency == 0
    assert result.diagnosis[0] == "empty_loss"
    assert "numerical_op" not in result.diagnosis
