"""trainguard under torch.distributed: every rank reaches the same decision.

The two-rank tests run real DDP and FSDP2 training on two gloo processes (tests/distributed).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from trainguard import Guard, GuardConfig, RunReader, UsageError
from trainguard.distributed import (
    DESYNC_RTOL,
    DistributedContext,
    collective_device,
    distributed_context,
    local_tensor,
    replica_difference,
    shard_count,
)
from trainguard.transfer import transfer_count

from .conftest import make_setup
from .distributed import scenarios
from .distributed.harness import run_ranks

QUIET = GuardConfig(sinks={"console": False})


# -- a single process: no context, no collective ---------------------------------------------------
def test_a_single_process_has_no_context_and_one_transfer_per_step() -> None:
    assert not dist.is_initialized()
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, config=QUIET)
    assert guard.run.dist is None and guard.run.ranks is None and guard.run.is_main
    assert distributed_context(torch.device("cpu")) is None
    counts = []
    for _ in range(5):
        loss = setup.model.loss(setup.batch())
        loss.backward()
        before = transfer_count()
        guard.step(loss)
        counts.append(transfer_count() - before)
        setup.optimizer.zero_grad(set_to_none=True)
    guard.close()
    assert counts == [1] * 5


def test_a_process_group_of_one_rank_has_no_context(tmp_path) -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert distributed_context(torch.device("cpu")) is None
        setup = make_setup()
        guard = Guard(setup.model, setup.optimizer, config=QUIET, run_dir=tmp_path / "run")
        assert guard.run.dist is None and guard.run.store is not None
        loss = setup.model.loss(setup.batch())
        loss.backward()
        assert guard.step(loss).action in ("applied", "clipped")
        guard.close()
    finally:
        dist.destroy_process_group()
    with RunReader(tmp_path / "run") as reader:
        assert "distributed" not in reader.meta()


def test_collectives_run_on_the_device_the_backend_serves() -> None:
    cpu, accel = torch.device("cpu"), torch.device("xpu", 0)
    assert collective_device("gloo", accel) == cpu
    assert collective_device("cpu:gloo,xpu:xccl", accel) == accel
    assert collective_device("cpu:gloo,cuda:nccl", cpu) == cpu
    assert collective_device("cpu:gloo,cuda:nccl", accel) == cpu
    assert collective_device("mpi", accel) == accel


def test_agree_max_wants_an_int_code() -> None:
    context = DistributedContext(rank=1, world_size=2, device=torch.device("cpu"), backend="gloo")
    assert not context.is_main
    for code in (1.5, True, "2"):
        with pytest.raises(UsageError, match="int code"):
            context.agree_max(code)  # type: ignore[arg-type]


def test_plain_tensors_are_one_whole_shard() -> None:
    weight = nn.Parameter(torch.ones(3, 2))
    assert shard_count(weight) == 1
    assert local_tensor(weight) is weight


# -- fingerprint comparison ----------------------------------------------------------------------
def fingerprint_table(weights: list[list[np.ndarray]]) -> np.ndarray:
    """[ranks, (norm, sum), params] as the desync check gathers it."""
    return np.array([[[np.linalg.norm(w) for w in rank], [w.sum() for w in rank]]
                     for rank in weights])


def test_equal_replicas_do_not_differ_and_one_nudged_weight_does() -> None:
    rng = np.random.default_rng(0)
    params = [rng.normal(size=1000).astype(np.float32).astype(np.float64),
              rng.normal(size=10).astype(np.float32).astype(np.float64)]
    numel = np.array([p.size for p in params], dtype=np.float64)
    equal = fingerprint_table([params, [p.copy() for p in params]])
    assert replica_difference(equal, numel).tolist() == [0.0, 0.0]

    reordered = fingerprint_table([params, [p[::-1].copy() for p in params]])
    assert (replica_difference(reordered, numel) < DESYNC_RTOL).all()  # summation order only

    nudged = [p.copy() for p in params]
    nudged[0][7] = np.nextafter(np.float32(nudged[0][7]), np.float32(np.inf))  # one float32 ulp
    difference = replica_difference(fingerprint_table([params, nudged]), numel)
    assert difference[0] > DESYNC_RTOL and difference[1] == 0.0


def test_a_weight_non_finite_on_one_rank_only_is_infinitely_far() -> None:
    params = [np.ones(4), np.ones(3)]
    broken = [np.array([1.0, math.nan, 1.0, 1.0]), np.ones(3)]
    numel = np.array([4.0, 3.0])
    difference = replica_difference(fingerprint_table([params, broken]), numel)
    assert difference.tolist() == [math.inf, 0.0]
    # NaN on every rank: nothing to compare (nonfinite_weight reports it), not a desync
    both = replica_difference(fingerprint_table([broken, broken]), numel)
    assert both.tolist() == [0.0, 0.0]


# -- two ranks -------------------------------------------------------------------------------------
def test_ddp_deferred_skips_on_the_flag_reduced_across_ranks_as_blocking_does() -> None:
    """`sync="deferred"` under DDP: every rank skips where any rank's loss or the agreed
    gradients are not finite, clips on the agreed norm, and trains as the blocking run."""
    blocking = run_ranks(scenarios.ddp_deferred, "blocking")
    deferred = run_ranks(scenarios.ddp_deferred, "deferred")
    assert all(r["deferred"] for r in deferred) and not any(r["deferred"] for r in blocking)
    for rank in (0, 1):
        assert deferred[rank]["reports"] == blocking[rank]["reports"][:-1]
        assert deferred[rank]["events"] == blocking[rank]["events"]
        assert deferred[rank]["weights"] == blocking[rank]["weights"]
        assert deferred[rank]["adam_steps"] == blocking[rank]["adam_steps"] == [9.0]
    assert deferred[0]["reports"] == deferred[1]["reports"]
    assert [r[0] for r in deferred[0]["reports"] if r[1] == "skipped"] == [4, 7, 9]
    assert any(r[1] == "clipped" for r in deferred[0]["reports"])
    assert deferred[0]["weights"] == deferred[1]["weights"]
    steady = [i for i in range(2, 12) if i not in (5, 8, 10)]  # not after a fault
    assert [deferred[0]["blocking"][i] for i in steady] == [0] * len(steady)
    assert [blocking[0]["blocking"][i] for i in steady] == [1] * len(steady)


def test_fsdp2_deferred_clips_on_the_agreed_norm_as_blocking_does() -> None:
    blocking = run_ranks(scenarios.fsdp2_deferred, "blocking")
    deferred = run_ranks(scenarios.fsdp2_deferred, "deferred")
    assert all(r["deferred"] for r in deferred)
    for rank in (0, 1):
        assert deferred[rank]["reports"] == blocking[rank]["reports"][:-1]
        assert deferred[rank]["weights"] == blocking[rank]["weights"]
    assert deferred[0]["reports"] == deferred[1]["reports"]
    assert [r[1] for r in deferred[0]["reports"]].count("clipped") >= 1
    assert deferred[0]["reports"][3][1] == "skipped"


def test_ddp_defers_on_every_rank_or_none() -> None:
    rank0, rank1 = run_ranks(scenarios.ddp_deferred_on_one_rank_only)
    assert not rank0["deferred"] and not rank1["deferred"]
    assert rank0["actions"] == rank1["actions"]  # (fused and foreach AdamW round apart)


def test_ddp_nonfinite_loss_on_one_rank_skips_the_step_on_every_rank(tmp_path) -> None:
    run_dir = tmp_path / "run"
    rank0, rank1 = run_ranks(scenarios.ddp_nonfinite_on_one_rank, str(run_dir))
    assert rank0["context"] == (0, 2, "cpu", True)
    assert rank1["context"] == (1, 2, "cpu", False)
    skipped = [i for i, action in enumerate(rank0["actions"]) if action == "skipped"]
    assert skipped == [4, 7, 9]
    for key in ("actions", "events"):
        assert rank0[key] == rank1[key], key
    # the loss every rank reads: NaN (poisoned sample), +inf (rank 1 only), NaN (+inf and -inf)
    for losses in (rank0["losses"], rank1["losses"]):
        assert math.isnan(losses[4]) and losses[7] == math.inf and math.isnan(losses[9])
        assert all(math.isfinite(v) for i, v in enumerate(losses) if i not in skipped)
    assert [e[0] for e in rank0["events"][7]] == ["nonfinite_loss"]  # rank 0's own loss was fine
    # the replicas stay finite and identical, and Adam counted only the applied steps
    assert rank0["weights"] == rank1["weights"]
    assert all(math.isfinite(w) for w in rank0["weights"])
    assert rank0["adam_steps"] == rank1["adam_steps"] == [12.0 - len(skipped)]
    # one transfer per step: the replicas' fingerprint rides the step's all-reduce (steps 0, 5
    # and 10 carry one), and the replicas agree, so no second check runs
    assert rank0["transfers"] == [1] * 12
    # only rank 0 writes the store
    assert rank0["has_store"] and not rank1["has_store"]
    with RunReader(run_dir) as reader:
        assert reader.meta()["distributed"] == {"rank": 0, "world_size": 2, "backend": "gloo"}
        stored = [(e.kind, e.step) for e in reader.events()]
    assert stored == [("nonfinite_loss", 4), ("nonfinite_grad", 4), ("nonfinite_loss", 7),
                      ("nonfinite_loss", 9)]


def test_events_name_the_rank_a_non_finite_value_came_from(tmp_path) -> None:
    rank0, rank1 = run_ranks(scenarios.ddp_nonfinite_on_one_rank, str(tmp_path / "run"))
    assert rank0["messages"] == rank1["messages"], "every rank says the same"
    by_step = {step: {kind: (message, ranks) for kind, message, ranks in events}
               for step, events in enumerate(rank0["messages"]) if events}
    # step 4: rank 1's poisoned sample; DDP's gradient average carries the NaN to rank 0 too,
    # and the gradient event names the rank whose own loss was non-finite
    assert by_step[4]["nonfinite_loss"] == ("loss is nan (on rank 1 only)", [1])
    assert by_step[4]["nonfinite_grad"][1] == [1]
    assert by_step[4]["nonfinite_grad"][0].endswith(
        "(after the all-reduce, on every rank; from rank 1's non-finite loss)")
    assert by_step[7]["nonfinite_loss"] == ("loss is inf (on rank 1 only)", [1])
    assert by_step[9]["nonfinite_loss"] == ("loss is nan (on every rank)", [0, 1])


def test_a_nan_batch_on_rank_1_is_diagnosed_as_the_input_of_rank_1() -> None:
    rank0, rank1 = run_ranks(scenarios.ddp_nan_batch_on_one_rank)
    assert rank0["weights"] == rank1["weights"]
    assert rank0["messages"] == rank1["messages"], "every rank hears rank 1's batch finding"
    found = [m for m in rank0["messages"] if m[1] == "batch_nonfinite"]
    assert [(m[0], m[3]) for m in found] == [(6, None)]
    assert found[0][2].startswith("on rank 1: field 'x' holds 1 non-finite value")
    grad = next(m for m in rank0["messages"] if m[1] == "nonfinite_grad")
    assert grad[2].endswith("(after the all-reduce, on every rank; from rank 1's non-finite loss)")
    assert grad[4] == "nonfinite", "rank 1's batch was inspected and held the NaN"
    for rank in (rank0, rank1):
        code, confidence, evidence = rank["diagnosis"][0]
        assert code == "nonfinite_input" and confidence > 0.5
        assert "on rank 1: field 'x'" in evidence[0]
        assert not any("finite batch" in e for c in rank["diagnosis"] for e in c[2])


def test_a_nan_loss_from_clean_batches_says_whose_batch_was_checked() -> None:
    rank0, _ = run_ranks(scenarios.ddp_nan_batch_on_one_rank, None, 6)
    loss = next(m for m in rank0["messages"] if m[1] == "nonfinite_loss")
    assert loss[3] == [1] and loss[4] == "finite"
    code, _, evidence = rank0["diagnosis"][0]
    assert code == "numerical_op"
    assert evidence[0] == ("the loss turned non-finite at step 6 with rank 1's batch inspected "
                           "and finite")


def test_ddp_outlier_batch_on_one_rank_is_told_alike_on_every_rank(tmp_path) -> None:
    """One batch with targets 40x on rank 1: an outlier batch, told on both ranks (naming the
    rank it came from) at the step it happened, and the same decision on both: the loss came
    back, so nothing halts."""
    spike = 20
    rank0, rank1 = run_ranks(scenarios.ddp_spike_on_one_rank, spike, str(tmp_path))
    own0, own1 = rank0["own_losses"][spike], rank1["own_losses"][spike]
    assert own1 > 100 * own0 and own0 < 3 * np.median(rank0["own_losses"][:spike])
    for rank in (rank0, rank1):
        assert rank["halt"] is None
        told = [e for e in rank["events"] if e[0] == "loss_spike"]
        assert [e[1:3] for e in told] == [("info", spike)]
        assert f"(on rank 1 only: own loss rank 1 {own1:.4g})" in told[0][3]
    assert rank0["events"] == rank1["events"]
    assert rank0["actions"] == rank1["actions"]
    assert rank0["weights"] == rank1["weights"]


def test_ddp_loss_spike_on_one_rank_halts_every_rank_at_the_same_step(tmp_path) -> None:
    """The same targets on every batch of rank 1 from then on: the loss stays up, the spike is
    an error at the next step, and both ranks halt there."""
    spike = 20
    rank0, rank1 = run_ranks(scenarios.ddp_spike_on_one_rank, spike, str(tmp_path), True)
    own0, own1 = rank0["own_losses"][spike + 1], rank1["own_losses"][spike + 1]
    for rank in (rank0, rank1):
        assert rank["halt"] is not None, "both ranks must halt"
        assert rank["halt"]["step"] == spike + 1
        assert rank["halt"]["loss"] == pytest.approx((own0 + own1) / 2, rel=1e-6)
        assert ("loss_spike", "error", spike + 1) in [e[:3] for e in rank["halt"]["events"]]
    assert rank0["halt"] == rank1["halt"]
    assert rank0["actions"] == rank1["actions"]
    assert rank0["weights"] == rank1["weights"]


def test_fsdp2_global_grad_norm_is_that_of_the_unsharded_model(tmp_path) -> None:
    run_dir = tmp_path / "run"
    rank0, rank1 = run_ranks(scenarios.fsdp2_global_norm, str(run_dir), 0.5)
    assert rank0["local_shapes"] != rank1["local_shapes"], "the layers must really be sharded"
    for rank in (rank0, rank1):
        assert rank["actions"] == ["clipped"] * 4
        np.testing.assert_allclose(rank["norms"], rank["ref_norms"], rtol=1e-5)
        np.testing.assert_allclose(rank["losses"], rank["ref_losses"], rtol=1e-6)
        assert rank["weight_gap"] < 1e-6  # clipped with the global norm, as the unsharded model
    assert rank0["norms"] == rank1["norms"]
    with RunReader(run_dir) as reader:
        assert reader.param_names() == rank0["names"] == ["0.weight", "0.bias", "2.weight",
                                                          "2.bias"]
        steps, per_param = reader.param_grad_norms()
        # sampled weight statistics of the sharded parameters agree with the unsharded ones
        sampled, maxabs = reader.param_metric("weight_maxabs")
        _, weight_norms = reader.param_metric("weight_norm")
    assert steps.tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(per_param, rank0["ref_param_norms"], rtol=1e-5)
    assert sampled.tolist() == [0, 2]  # sampled after the updates of steps 0 and 2
    np.testing.assert_allclose(maxabs, [rank0["ref_maxabs"][s] for s in (0, 2)], rtol=1e-6)
    np.testing.assert_allclose(weight_norms, [rank0["ref_weight_norms"][s] for s in (0, 2)],
                               rtol=1e-5)


def test_desync_names_the_perturbed_parameter_on_every_rank(tmp_path) -> None:
    run_dir = tmp_path / "run"
    rank0, rank1 = run_ranks(scenarios.ddp_desync, str(run_dir), "module.0.bias")
    # checks at steps 0, 4, 8 and 12; the nudge after step 5 shows at 8, once
    for rank in (rank0, rank1):
        assert len(rank["events"]) == 1
        step, severity, param, params, ranks, cause, value = rank["events"][0]
        assert (step, severity, param, params, ranks, cause) == (
            8, "error", "module.0.bias", ["module.0.bias"], [1], "ddp_desync")
        assert DESYNC_RTOL < value < 1e-2
    assert rank0["events"] == rank1["events"]
    assert rank0["has_store"] and not rank1["has_store"]
    with RunReader(run_dir) as reader:
        stored = [e for e in reader.events() if e.kind == "ddp_desync"]
    assert [(e.step, e.param, e.details["params"]) for e in stored] == [
        (8, "module.0.bias", ["module.0.bias"])]
    assert rank0["agree_max"] == rank1["agree_max"] == 4


def test_both_reduction_paths_agree_on_gradients_that_differ_across_ranks() -> None:
    rank0, rank1 = run_ranks(scenarios.agreement_paths)
    # replicated gradients that differ (a desync, or no_sync) agree as the mean of squares
    norms = np.sqrt((np.square(rank0["own_norms"]) + np.square(rank1["own_norms"])) / 2)
    for rank, lr in ((rank0, 0.25), (rank1, 1.25)):
        for on_host in (False, True):
            inf = rank[f"inf_on_rank1:{on_host}"]
            assert inf["loss"] == [math.inf]
            np.testing.assert_allclose(inf["param_grad_norm"], norms, rtol=1e-6)
            np.testing.assert_allclose(inf["grad_norm"], [np.linalg.norm(norms)], rtol=1e-6)
            assert inf["lr"] == [lr]  # not agreed: travels as it is
            only0 = rank[f"rank0_only:{on_host}"]
            np.testing.assert_allclose(only0["loss"], [rank0["own_loss"]], rtol=1e-6)
            assert rank[f"inf_on_rank1:{on_host}:transfers"] == 1
        assert "fp16_grad_maxabs" not in rank["inf_on_rank1:False"]
    assert rank0["inf_on_rank1:False"]["param_grad_norm"] == rank1[
        "inf_on_rank1:False"]["param_grad_norm"]


def test_ddp_recover_rolls_back_every_rank_to_the_same_state() -> None:
    rank0, rank1 = run_ranks(scenarios.ddp_recover_on_one_rank)
    assert ("batch_nonfinite", 5) in rank1["batch_events"]  # rank 1's own finding...
    assert ("batch_nonfinite", 5) not in rank0["batch_events"]  # ...that rank 0 cannot see
    assert "rolled_back" in rank0["actions"]
    for key in ("actions", "events", "ring", "weights"):
        assert rank0[key] == rank1[key], key
    assert all(math.isfinite(w) for w in rank0["weights"])


def test_ddp_deferred_recover_rolls_every_rank_back_to_the_blocking_state() -> None:
    """Judged a step late, the rollback is decided alike on both ranks (rank 1's batch finding
    is its own and drives nothing), restores the state the blocking run restores, and drops the
    next step's update on every rank."""
    blocking = run_ranks(scenarios.ddp_recover_deferred, "blocking")
    deferred = run_ranks(scenarios.ddp_recover_deferred, "deferred")
    assert all(r["deferred"] for r in deferred) and not any(r["deferred"] for r in blocking)
    for key in ("reports", "events", "ring", "weights", "rolled_back_steps"):
        assert deferred[0][key] == deferred[1][key], key
    rollbacks = [(e[1], e[2]) for e in deferred[0]["events"] if e[0] == "rollback"]
    assert rollbacks == [(e[1], e[2]) for e in blocking[0]["events"] if e[0] == "rollback"]
    assert len(rollbacks) == 1
    at = rollbacks[0][0]
    # the good state the blocking rollback restored, restored one call later
    assert deferred[0]["weights"][at + 1] == blocking[0]["weights"][at]
    assert (at + 1, "skipped") in deferred[0]["reports"]  # the dropped step
    assert deferred[0]["rolled_back_steps"] == blocking[0]["rolled_back_steps"] + 1
    assert all(math.isfinite(w) for w in deferred[0]["weights"][-1])
    # before the fault the only blocking reads are the agreements of the ring candidates'
    # finite flags (one per candidate, kept every 5 steps): the ring's periodic cost
    calls = deferred[0]["blocking"][:25]
    assert [i for i, n in enumerate(calls) if n] == [6, 11, 16, 21]
    assert max(calls) == 1


@pytest.mark.parametrize("policy", ["halt", "protect"])
def test_desync_halts_both_ranks_at_the_check_that_sees_it(policy: str) -> None:
    rank0, rank1 = run_ranks(scenarios.ddp_desync_under_policy, policy)
    for rank in (rank0, rank1):
        assert rank["halted_at"] == 8
        assert len(rank["actions"]) == 8  # steps 0-7 went through
        assert [kind for kind, _, _ in rank["events"]] == ["ddp_desync"]
    assert rank0["events"] == rank1["events"]


@pytest.mark.parametrize("policy", ["halt", "protect"])
def test_a_drift_at_step_30_is_caught_within_5_steps_by_default(policy: str,
                                                                 tmp_path: Path) -> None:
    rank0, rank1 = run_ranks(scenarios.ddp_desync_under_policy, policy, 30, None, 45,
                             str(tmp_path))
    for rank in (rank0, rank1):
        assert rank["halted_at"] is not None and 31 <= rank["halted_at"] <= 35
        assert [kind for kind, _, _ in rank["events"]] == ["ddp_desync"]
    assert rank0["halted_at"] == rank1["halted_at"]
    assert [p.name for p in tmp_path.iterdir()] == [f"crash_step{rank0['halted_at']}.pt"], \
        "one crash snapshot, written by rank 0"


def test_desync_under_recover_rolls_both_ranks_back_to_agreeing_weights() -> None:
    rank0, rank1 = run_ranks(scenarios.ddp_desync_under_policy, "recover")
    for rank in (rank0, rank1):
        assert rank["halted_at"] is None
        assert rank["actions"][8] == "rolled_back"
        # back to the state kept at step 4, the last check that found the replicas equal
        assert ("rollback", 8, 4) in rank["events"]
        assert [e for e in rank["events"] if e[0] == "ddp_desync"] == [("ddp_desync", 8, None)]
    assert rank0["actions"] == rank1["actions"]
    assert rank0["weights"] == rank1["weights"]  # in sync again, bit for bit


# -- a rank that dies ------------------------------------------------------------------------------
def test_a_dead_peer_stops_the_surviving_rank_with_one_clear_error(tmp_path) -> None:
    """Rank 1 is killed inside a run whose only collective is trainguard's: rank 0 stops soon
    after (it used to train on unguarded, one monitor_error per step), names rank 1, and the
    store says the run failed and why."""
    run_dir = tmp_path / "run"
    timeout = 5.0
    rank0, rank1 = run_ranks(scenarios.peer_killed, str(run_dir), 4, timeout, dies=(1,))
    assert rank1 is None
    assert rank0["error"] is not None, rank0
    assert rank0["ranks"] == [1] and rank0["step"] == 4 and rank0["steps"] == 4
    assert "rank 1 is gone" in rank0["error"] and "at step 4" in rank0["error"]
    assert rank0["after_s"] < timeout + 5.0  # the roll call waits at most the timeout
    assert rank0["closed"] and rank0["again"] == rank0["error"]
    assert rank0["events"] == [("peer_lost", "error")]  # no monitor_error
    with RunReader(run_dir) as reader:
        assert reader.meta()["status"] == "failed"
        events = reader.events()
    assert [(e.kind, e.details["ranks"]) for e in events] == [("peer_lost", [1])]
    assert "rank 1 is gone" in events[0].message


def test_a_hung_peer_stops_the_surviving_rank_after_the_collective_timeout(tmp_path) -> None:
    """Rank 1 stops (SIGSTOP) without closing its connections: rank 0 waits out
    collective_timeout_s in trainguard's own process group, not the default group's 30 s."""
    timeout = 2.0
    rank0, _ = run_ranks(scenarios.peer_killed, str(tmp_path / "run"), 4, timeout, "SIGSTOP",
                         dies=(1,))
    assert rank0["ranks"] == [1] and "rank 1 hangs or is gone" in rank0["error"]
    assert "Timed out" in rank0["error"]
    assert 2 * timeout - 0.5 < rank0["after_s"] < 2 * timeout + 5.0  # the timeout, the roll call
