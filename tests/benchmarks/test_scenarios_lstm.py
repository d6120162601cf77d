"""The lstm scenario family: a healthy fine-tune converges quietly, a 0/0 loss is caught."""

from __future__ import annotations

import math

import torch
from benchmarks.scenarios.base import Scenario
from benchmarks.scenarios.families import lstm
from benchmarks.scenarios.runner import run_scenario


def _by_name(name: str) -> Scenario:
    return next(s for s in lstm.scenarios() if s.name == name)


def test_batches_depend_only_on_seed_step_and_micro() -> None:
    scenario = _by_name("lstm_healthy_sgd")
    first, second = scenario.build(3), scenario.build(3)
    second.batch(4, 0)
    assert torch.equal(first.batch(7, 0)["tokens"], second.batch(7, 0)["tokens"])
    assert not torch.equal(first.batch(7, 0)["tokens"], scenario.build(4).batch(7, 0)["tokens"])


def test_healthy_fine_tune_converges_without_events() -> None:
    scenario = _by_name("lstm_healthy_sgd")
    workload = scenario.build(0)
    start = workload.evaluate(workload.model)
    result = run_scenario(scenario, "trainguard", steps=80)
    assert result.outcome == "finished"
    assert result.events == []
    assert result.final_eval_loss < 0.5 * start


def test_zero_target_batch_poisons_an_unprotected_run_and_is_skipped_under_trainguard() -> None:
    scenario = _by_name("lstm_numerical_op")
    steps = scenario.onset_step + 5
    unprotected = run_scenario(scenario, "none", steps=steps)
    assert unprotected.outcome == "nan"
    result = run_scenario(scenario, "trainguard", steps=steps)
    assert result.detected and result.latency == 0
    assert result.false_alarms == 0
    assert result.actions.get("skipped") == 1
    assert math.isfinite(result.final_eval_loss)


def test_the_schedule_restart_spikes_the_sgd_lr_for_its_steps_only() -> None:
    spike = _by_name("lstm_lr_spike")
    workload = spike.build(0)
    lrs = []
    for _ in range(spike.steps):
        lrs.append(workload.optimizer.param_groups[0]["lr"])
        workload.optimizer.step()
        workload.scheduler.step()
    high = lstm.SGD_SANE_LR * lstm.LR_SPIKE_FACTOR
    assert [i for i, lr in enumerate(lrs) if lr == high] == list(
        range(spike.onset_step, spike.onset_step + lstm.LR_SPIKE_STEPS))
    assert all(lr in (high, lstm.SGD_SANE_LR) for lr in lrs)
