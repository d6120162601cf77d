"""The scenario suite's `--fused` workloads and the deferred-against-blocking comparison."""

from __future__ import annotations

import torch
from benchmarks.deferred_parity import compare, summary, traced_run
from benchmarks.scenarios import scenario
from benchmarks.scenarios.base import make_fused

from trainguard import GuardConfig


def test_make_fused_turns_a_fresh_optimizer_fused_and_leaves_a_stepped_one() -> None:
    param = torch.nn.Parameter(torch.ones(3))
    adam = torch.optim.AdamW([param], lr=0.1)
    assert make_fused(adam)
    assert adam.param_groups[0]["fused"] and adam.defaults["fused"]
    param.grad = torch.ones(3)
    adam.step()
    assert adam.state[param]["step"].dtype == torch.float32  # made as fused makes it
    other = torch.optim.Adam([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    other.param_groups[0]["params"][0].grad = torch.ones(2)
    other.step()
    assert not make_fused(other)  # its state was made unfused
    assert not make_fused(torch.optim.RMSprop([torch.nn.Parameter(torch.ones(2))]))


def test_a_deferred_scenario_run_decides_as_the_blocking_one() -> None:
    s = scenario("lstm_numerical_op")  # plain SGD; its NaN batch is at step 120
    blocking = traced_run(s, GuardConfig(sinks={"console": False}), 0, steps=124)
    deferred = traced_run(s, GuardConfig(sync="deferred", sinks={"console": False}), 0, steps=124)
    row = compare(s, blocking, deferred)
    assert row.deferred and not row.fallback
    assert row.same_steps and row.same_actions and row.same_events and row.identical_weights
    assert ("nonfinite_loss", 120) in blocking[1].events
    assert [a for _, a, _ in deferred[1].steps].count("skipped") == 1
    assert deferred[0].actions == blocking[0].actions  # counted as the Guard reported them
    assert summary([row])["bit-identical weights"] == 1
