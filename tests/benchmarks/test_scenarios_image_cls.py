"""The image_cls scenario family: a healthy fine-tune converges quietly, an outlier batch is
caught at its step."""

from __future__ import annotations

import math

import torch
from benchmarks.scenarios.base import Scenario
from benchmarks.scenarios.families import image_cls
from benchmarks.scenarios.runner import run_scenario


def _by_name(name: str) -> Scenario:
    return next(s for s in image_cls.scenarios() if s.name == name)


def test_batches_depend_only_on_seed_step_and_micro() -> None:
    scenario = _by_name("image_cls_healthy")
    first, second = scenario.build(3), scenario.build(3)
    second.batch(4, 0)
    for a, b in zip(first.batch(7, 0), second.batch(7, 0), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first.batch(7, 0)[0], scenario.build(4).batch(7, 0)[0])


def test_healthy_fine_tune_converges_without_events() -> None:
    scenario = _by_name("image_cls_healthy")
    workload = scenario.build(0)
    start = workload.evaluate(workload.model)
    result = run_scenario(scenario, "trainguard", steps=80)
    assert result.outcome == "finished"
    assert result.events == []
    assert result.final_eval_loss < 0.5 * start


def test_outlier_batch_is_caught_at_its_step() -> None:
    scenario = _by_name("image_cls_outlier_1000x")
    result = run_scenario(scenario, "trainguard", steps=scenario.onset_step + 5)
    assert result.detected and result.latency == 0
    assert result.false_alarms == 0
    assert math.isfinite(result.final_eval_loss)


def test_a_burst_poisons_consecutive_batches_from_its_onset() -> None:
    nan_burst, outlier_burst = _by_name("image_cls_nan_burst"), _by_name("image_cls_outlier_burst")
    onset, burst = nan_burst.onset_step, image_cls.BURST
    nans, outliers = nan_burst.build(0), outlier_burst.build(0)
    poisoned = [step for step in range(onset - 2, onset + burst + 2)
                if torch.isnan(nans.batch(step, 0)[0]).any()]
    assert poisoned == list(range(onset, onset + burst))
    clean = _by_name("image_cls_healthy").build(0)
    for step in (onset, onset + burst - 1):
        assert torch.allclose(outliers.batch(step, 0)[0], 100.0 * clean.batch(step, 0)[0])
    assert torch.equal(outliers.batch(onset + burst, 0)[0], clean.batch(onset + burst, 0)[0])
