"""The HF Trainer callback on two real gloo ranks: every rank or none, the same setup on each."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from tests.distributed import hf_scenarios
from tests.distributed.harness import RankFailed, run_ranks


def test_the_callback_on_rank_0_only_ends_with_a_clear_error_in_seconds(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(RankFailed) as info:
        run_ranks(hf_scenarios.callback_on_rank0_only, str(tmp_path), 3.0, fail_fast=True)
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert "rank 0:" in message
    assert "rank(s) 1 did not start trainguard within 3 s" in message
    assert "not only on rank 0" in message
    assert elapsed < 30, f"took {elapsed:.0f} s: it must not wait for a collective timeout"


def test_ranks_with_different_configurations_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RankFailed) as info:
        run_ranks(hf_scenarios.different_configs, str(tmp_path), fail_fast=True)
    assert ("rank 1 runs trainguard with another setup than rank 0: config.policy is "
            "'recover' there, 'protect' on rank 0") in str(info.value)


def test_the_callback_on_every_rank_trains(tmp_path: Path) -> None:
    rank0, rank1 = run_ranks(hf_scenarios.callback_on_every_rank, str(tmp_path), "protect")
    assert rank0 == rank1 == {"steps": 4, "world": 2}


def test_fsdp_asked_for_but_ddp_run_is_guarded(tmp_path: Path) -> None:
    """`fsdp="full_shard"` on CPU ranks: the Trainer really runs DDP, and the callback, which
    looks at what was wrapped, guards it instead of refusing the arguments."""
    rank0, rank1 = run_ranks(hf_scenarios.fsdp_asked_for, str(tmp_path))
    assert rank0 == rank1 == {"steps": 3, "wrapped": "DistributedDataParallel"}


def test_an_fsdp2_model_is_accepted_by_what_was_wrapped() -> None:
    rank0, rank1 = run_ranks(hf_scenarios.sharding_checks)
    assert rank0 == rank1 == {"fsdp2": "accepted", "dtensor": "DTensor"}


def test_deepspeed_is_refused_only_where_it_is_really_on() -> None:
    from torch import nn

    from trainguard.errors import UsageError
    from trainguard.integrations.hf import check_sharding

    model = nn.Linear(4, 1)
    check_sharding(model, __import__("torch").optim.SGD(model.parameters(), lr=0.1))
    engine_optimizer = type("DeepSpeedZeroOptimizer", (), {"__module__": "deepspeed.runtime.zero"})
    wrapper = type("AcceleratedOptimizer", (), {})()
    wrapper.optimizer = engine_optimizer()
    with pytest.raises(UsageError, match="does not support DeepSpeed"):
        check_sharding(model, wrapper)


@pytest.mark.slow
def test_a_nan_burst_at_step_30_under_recover_loses_at_most_10_steps(tmp_path: Path) -> None:
    rank0, rank1 = run_ranks(hf_scenarios.nan_burst_under_recover, str(tmp_path), (30, 31, 32))
    assert rank0 == rank1, "the same rollback and the same weights on both ranks"
    rollbacks = [e for e in rank0["events"] if e[0] == "rollback"]
    assert len(rollbacks) == 1 and rollbacks[0][1] == 32
    assert rollbacks[0][2] <= 10, rollbacks
    nan = [e for e in rank0["events"] if e[0] == "nonfinite_loss"]
    assert [(e[1], e[3]) for e in nan] == [(30, [1]), (31, [1]), (32, [1])], "rank 1 only"
