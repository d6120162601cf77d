"""The gpt2 scenario family: a healthy fine-tune converges quietly, a NaN fault is caught."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks.scenarios.base import Scenario
from benchmarks.scenarios.families import gpt2
from benchmarks.scenarios.runner import run_scenario


def _by_name(name: str) -> Scenario:
    return next(s for s in gpt2.scenarios() if s.name == name)


def test_batches_depend_only_on_seed_step_and_micro() -> None:
    scenario = _by_name("gpt2_healthy")
    first, second = scenario.build(3), scenario.build(3)
    assert torch.equal(first.batch(5, 0), second.batch(5, 0))
    second.batch(4, 0)
    assert torch.equal(first.batch(7, 0), second.batch(7, 0))
    assert not torch.equal(first.batch(7, 0), scenario.build(4).batch(7, 0))


def test_healthy_fine_tune_converges_without_events() -> None:
    scenario = _by_name("gpt2_healthy")
    workload = scenario.build(0)
    start = workload.evaluate(workload.model)
    result = run_scenario(scenario, "trainguard", steps=60)
    assert result.outcome == "finished"
    assert result.events == []
    assert result.final_eval_loss < 0.5 * start


def test_log_of_zero_is_caught_at_its_step() -> None:
    scenario = _by_name("gpt2_numerical_op")
    result = run_scenario(scenario, "trainguard", steps=scenario.onset_step + 5)
    assert result.detected and result.latency == 0
    assert result.false_alarms == 0
    assert math.isfinite(result.final_eval_loss)


def test_the_wrongly_encoded_shard_covers_its_steps_only() -> None:
    shard = _by_name("gpt2_tokenizer_shard")
    faulty, healthy = shard.build(0), _by_name("gpt2_healthy").build(0)
    onset, length = shard.onset_step, gpt2.PERMUTED_SHARD_STEPS
    for step in (onset - 1, onset + length):
        assert torch.equal(faulty.batch(step, 0), healthy.batch(step, 0))
    for step in (onset, onset + length - 1):
        wrong, right = faulty.batch(step, 0), healthy.batch(step, 0)
        assert not torch.equal(wrong, right)
        # the same text under another vocabulary: a one-to-one relabelling of the ids
        pairs = set(zip(right.flatten().tolist(), wrong.flatten().tolist(), strict=True))
        assert len({a for a, _ in pairs}) == len(pairs) == len({b for _, b in pairs})
