"""The diffusion scenario family: a healthy DDPM fine-tune converges quietly, a learning rate
100x too high is caught within its first steps."""

from __future__ import annotations

import pytest
import torch
from benchmarks.scenarios.base import Scenario
from benchmarks.scenarios.families import diffusion
from benchmarks.scenarios.runner import run_scenario


def _by_name(name: str) -> Scenario:
    return next(s for s in diffusion.scenarios() if s.name == name)


def test_batches_depend_only_on_seed_step_and_micro() -> None:
    scenario = _by_name("diffusion_healthy")
    first, second = scenario.build(3), scenario.build(3)
    second.batch(4, 0)
    for a, b in zip(first.batch(7, 0), second.batch(7, 0), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first.batch(7, 0)[0], scenario.build(4).batch(7, 0)[0])


def test_healthy_fine_tune_converges_without_events() -> None:
    scenario = _by_name("diffusion_healthy")
    workload = scenario.build(0)
    start = workload.evaluate(workload.model)
    result = run_scenario(scenario, "trainguard", steps=60)
    assert result.outcome == "finished"
    assert result.events == []
    assert result.final_eval_loss < 0.75 * start


def test_learning_rate_far_too_high_is_caught_early() -> None:
    scenario = _by_name("diffusion_lr_too_high")
    result = run_scenario(scenario, "trainguard", steps=30)
    assert result.detected and result.latency is not None and result.latency <= 5
    assert result.false_alarms == 0


def _scheduled_lrs(scenario: Scenario, steps: int) -> list[float]:
    """The LR of each scheduler step, without training."""
    workload = scenario.build(0)
    lrs = []
    for _ in range(steps):
        lrs.append(workload.optimizer.param_groups[0]["lr"])
        workload.optimizer.step()
        workload.scheduler.step()
    return lrs


def test_the_schedule_restart_spikes_the_lr_for_its_steps_only() -> None:
    spike = _by_name("diffusion_lr_spike")
    spiked = _scheduled_lrs(spike, spike.steps)
    plain = _scheduled_lrs(_by_name("diffusion_healthy"), spike.steps)
    ratios = [a / b for a, b in zip(spiked, plain, strict=True)]
    onset = spike.onset_step
    window = range(onset, onset + diffusion.LR_SPIKE_STEPS)
    assert all(r == pytest.approx(diffusion.LR_SPIKE_FACTOR) for r in ratios[onset:window.stop])
    assert all(r == pytest.approx(1.0) for i, r in enumerate(ratios) if i not in window)
