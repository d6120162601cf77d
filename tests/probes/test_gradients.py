"""The gradient probe measures every gradient, a sparse one (`nn.Embedding(sparse=True)`) too."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn

from trainguard import Guard, GuardConfig

QUIET = {"sinks": {"console": False}, "probes": {"preflight": False}}


class Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 8, sparse=True)
        self.head = nn.Linear(8, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids).mean(1))


def _step(model: Bag, ids: torch.Tensor) -> torch.Tensor:
    loss = nn.functional.cross_entropy(model(ids), ids[:, 0] % 2)
    loss.backward()
    return loss


def test_a_sparse_gradient_is_measured_clipped_and_its_nan_found(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Bag()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = Guard(model, optimizer, config=GuardConfig(clip={"max_grad_norm": 0.01}, **QUIET),
                  run_dir=tmp_path / "run")
    for step in range(30):
        ids = torch.randint(0, 100, (16, 6))  # repeated ids: an uncoalesced gradient
        loss = _step(model, ids)
        dense = torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(p.grad.to_dense()) for p in model.parameters()]))
        if step == 25:
            model.emb.weight.grad = model.emb.weight.grad.coalesce() * float("nan")
        report = guard.step(loss.detach())
        assert report is not None
        if step < 25:
            assert torch.isclose(torch.tensor(report.grad_norm), dense, rtol=1e-5)
            assert report.action == "clipped"  # the sparse gradient scaled with the rest
        optimizer.zero_grad()
    guard.close()
    kinds = [e.kind for e in guard.events]
    assert "monitor_error" not in kinds
    assert "nonfinite_grad" in kinds
    assert torch.isfinite(model.emb.weight).all()  # the NaN step skipped


def test_sgd_momentum_of_a_sparse_gradient_is_read_on_sampled_steps_and_at_a_checkpoint(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """SGD keeps a sparse momentum for a sparse gradient: the sampled probes and the
    checkpoint's finiteness check read it by its values."""
    torch.manual_seed(0)
    model = Bag()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET), run_dir=tmp_path / "run")
    with caplog.at_level(logging.ERROR, logger="trainguard"):
        for _ in range(55):  # sampled at steps 0 and 50
            loss = _step(model, torch.randint(0, 100, (16, 6)))
            guard.step(loss.detach())
            optimizer.zero_grad()
        health = guard.checkpoint_health()
        assert health is not None and health.weights_finite and health.optimizer_finite
    guard.close()
    assert optimizer.state[model.emb.weight]["momentum_buffer"].is_sparse
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "monitor_error" not in {e.kind for e in guard.events}
