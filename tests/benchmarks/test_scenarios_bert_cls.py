"""The bert_cls scenario family: a healthy fine-tune converges quietly, pure-fp16 Adam is caught."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks.scenarios.base import Scenario
from benchmarks.scenarios.families import bert_cls
from benchmarks.scenarios.runner import run_scenario


def _by_name(name: str) -> Scenario:
    return next(s for s in bert_cls.scenarios() if s.name == name)


def test_batches_depend_only_on_seed_step_and_micro() -> None:
    scenario = _by_name("bert_cls_healthy")
    first, second = scenario.build(3), scenario.build(3)
    second.batch(4, 0)
    for key in ("input_ids", "attention_mask", "labels"):
        assert torch.equal(first.batch(7, 0)[key], second.batch(7, 0)[key])
    assert not torch.equal(first.batch(7, 0)["input_ids"],
                           scenario.build(4).batch(7, 0)["input_ids"])


def test_new_head_is_initialised_as_configured() -> None:
    healthy = _by_name("bert_cls_healthy").build(0).model.classifier.weight
    bad = _by_name("bert_cls_bad_init_std100").build(0).model.classifier.weight
    assert 0.01 < float(healthy.detach().std()) < 0.04
    assert 50 < float(bad.detach().std()) < 200


def test_healthy_fine_tune_converges_without_events() -> None:
    scenario = _by_name("bert_cls_healthy")
    workload = scenario.build(0)
    start = workload.evaluate(workload.model)
    result = run_scenario(scenario, "trainguard", steps=60)
    assert result.outcome == "finished"
    assert result.events == []
    assert result.final_eval_loss < 0.5 * start


def test_tiny_adam_eps_in_pure_fp16_is_caught_at_once() -> None:
    scenario = _by_name("bert_cls_optimizer_eps_fp16")
    result = run_scenario(scenario, "trainguard", steps=3)
    assert result.detected and result.latency == 0
    assert {"nonfinite_loss", "nonfinite_grad"} <= {e["kind"] for e in result.events}
