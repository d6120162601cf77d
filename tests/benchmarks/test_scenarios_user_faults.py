"""Faults made the way users make them, in the scenario suite: ground truth checked on the
unguarded run, and what trainguard makes of each (whether it is caught in time, and its cause
named, is a row of `test_scenario_families.py`'s table)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from benchmarks.scenarios import scenario
from benchmarks.scenarios.runner import run_scenario

HEALTHY_AT_80 = {}


def _healthy_eval(steps: int) -> float:
    if steps not in HEALTHY_AT_80:
        HEALTHY_AT_80[steps] = run_scenario(scenario("gpt2_healthy"), "none",
                                            steps=steps).final_eval_loss
    return HEALTHY_AT_80[steps]


@pytest.mark.parametrize(("name", "steps", "worse"), [
    ("gpt2_user_lr_jump", 80, 2.0), ("gpt2_late_group_lr", 80, 1.5),
    ("gpt2_forgotten_backward", 120, 1.02), ("gpt2_forgotten_zero_grad", 120, 1.02),
    ("gpt2_schedule_too_short", 200, 1.02)])
def test_the_fault_really_hurts_an_unguarded_run(name: str, steps: int, worse: float) -> None:
    unguarded = run_scenario(scenario(name), "none", steps=steps)
    assert unguarded.final_eval_loss > worse * _healthy_eval(steps)


def test_the_lr_jump_is_named_in_the_evidence() -> None:
    s = scenario("gpt2_user_lr_jump")
    result = run_scenario(s, "trainguard", steps=s.onset_step + 10)
    change = next(e for e in result.events if e["kind"] == "lr_change")
    # x99: the cosine decay moved the LR down by 1% between the two steps
    assert change["step"] == s.onset_step and change["message"].startswith("LR x99 at step 60")


def test_alpaca_lora_settings_are_a_quiet_healthy_run() -> None:
    result = run_scenario(scenario("gpt2_lora_healthy_alpaca"), "trainguard", steps=60)
    assert not [e for e in result.events if e["severity"] != "info"]
    assert not [f for f in result.findings if f["cause"] == "lora_scaling"]  # alpha/r = 2
    assert result.false_alarms == 0  # at the top of the guide's LoRA range: no LR finding


def test_student_t_targets_train_and_a_1000x_batch_is_still_caught() -> None:
    healthy = run_scenario(scenario("regression_healthy_student_t"), "trainguard", steps=200)
    assert healthy.false_alarms == 0  # the one big jump of this run comes at step 257
    fault = run_scenario(scenario("regression_outlier_batch"), "trainguard", steps=210)
    assert fault.detected and fault.latency == 0
    assert fault.diagnosis[0] == "outlier_batch"


def test_a_loss_summed_over_the_tokens_is_its_reduction_not_the_data() -> None:
    s = scenario("gpt2_loss_summed")
    unguarded = run_scenario(s, "none", steps=s.onset_step + 2)
    before, at = unguarded.train_losses[s.onset_step - 1], unguarded.train_losses[s.onset_step]
    assert at > 100 * before  # 16 x 31 token losses summed where they were averaged
    result = run_scenario(s, "trainguard", steps=s.onset_step + 10)
    assert result.detected and result.latency == 0
    assert result.diagnosis[0] == "loss_reduction" and "tokenizer_mismatch" not in result.diagnosis
