"""Cross-rank agreement read from the registry, and the desync check's last agreeing step, on one
process (the collectives are stood in for; tests/test_distributed.py runs real ranks)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from trainguard import distributed
from trainguard.distributed import AgreedPack, DistributedContext, RankAgreement
from trainguard.params import watched_params
from trainguard.registry import Reduction

CPU = torch.device("cpu")
CONTEXT = DistributedContext(rank=0, world_size=2, device=CPU, backend="gloo")


def agreement() -> RankAgreement:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    return RankAgreement(CONTEXT, watched_params(model, [torch.optim.SGD(model.parameters())]))


@pytest.mark.parametrize(("name", "agreed"), [
    ("loss", True), ("grad_norm", True), ("param_grad_norm", True), ("fp16_grad_maxabs", True),
    ("lr", False), ("loss_scale", False), ("x:batch", False), ("p0:weight_norm", False),
    ("m0:act_maxabs", False), ("my_own_segment", False)])
def test_the_every_step_segments_the_step_all_reduce_agrees(name: str, agreed: bool) -> None:
    assert distributed._agreed_every_step(name) is agreed


@pytest.mark.parametrize(("name", "reduction"), [
    ("p0:weight_maxabs", Reduction.MAX), ("p1:weight_nonfinite", Reduction.MAX),
    ("p0:weight_norm", Reduction.SUM_OF_SQUARES),
    ("p0:optstate_exp_avg_norm", Reduction.SUM_OF_SQUARES),
    ("p2:optstate_exp_avg_sq_norm", Reduction.SUM_OF_SQUARES),
    ("p0:weight_mean", None), ("p0:weight_std", None), ("p0:update_ratio", None),
    ("m0:act_maxabs", None), ("m0:act_nonfinite", None), ("weight_norm", None),
    ("x:ring_finite", None), ("p0:my_own_norm", None)])
def test_sampled_segments_are_agreed_as_the_registry_says(name: str, reduction: Any) -> None:
    assert distributed._sampled_reduction(name) is reduction


def test_sampled_statistics_go_to_one_all_reduce_per_reduction(monkeypatch) -> None:
    calls: list[tuple[Any, int]] = []

    def all_reduce(tensor: torch.Tensor, op: Any) -> None:
        calls.append((op, tensor.numel()))
        if op == torch.distributed.ReduceOp.SUM:
            tensor.mul_(2)  # the other rank holds the same squares

    monkeypatch.setattr(distributed.dist, "all_reduce", all_reduce)
    ranks = agreement()
    pack = AgreedPack(CPU, ranks, on_host=False)
    n = len(ranks.watched)
    norms = torch.arange(1.0, n + 1)
    for key in ("weight_maxabs", "weight_mean", "weight_norm", "optstate_exp_avg_norm"):
        pack.add(f"p0:{key}", norms)
    reduced = ranks.reduce_sampled(pack._sampled)
    assert set(reduced) == {"p0:weight_maxabs", "p0:weight_norm", "p0:optstate_exp_avg_norm"}
    assert calls == [(torch.distributed.ReduceOp.MAX, n), (torch.distributed.ReduceOp.SUM, 2 * n)]
    # replicated parameters: each rank holds half of the squares, two ranks make it whole
    assert torch.allclose(reduced["p0:weight_norm"].float(), norms)


def test_a_desync_carries_the_last_step_the_replicas_agreed(monkeypatch) -> None:
    drift = {"on": False}

    def all_gather(gathered: list[torch.Tensor], mine: torch.Tensor) -> None:
        gathered[0].copy_(mine)
        gathered[1].copy_(mine * (1.001 if drift["on"] else 1.0))

    monkeypatch.setattr(distributed.dist, "all_gather", all_gather)
    ranks = agreement()

    def check(step: int, drifting: bool) -> list:
        drift["on"] = drifting
        return ranks.check_desync(step)

    assert check(0, False) == [] and check(4, False) == []
    [event] = check(8, True)
    assert event.kind == "ddp_desync" and event.details["last_agreed_step"] == 4
    assert check(12, True) == []  # reported once
    assert check(16, False) == []
    [again] = check(20, True)
    assert again.details["last_agreed_step"] == 16
    fresh = agreement()
    drift["on"] = True
    [first] = fresh.check_desync(0)  # never seen equal: back to the start
    assert first.details["last_agreed_step"] == 0
    assert np.isfinite(first.value)
