"""A scenario's pre-trained starting point is the same whether this process trained it (a cold
cache, as on a clean clone) or loaded it: same weights, no grads left over, same modes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from benchmarks.scenarios import pretrain
from torch import nn


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.1), nn.Linear(8, 2))
    model[0].weight.requires_grad_(False)  # a frozen layer stays frozen
    model.eval()
    return model


def _train(model: nn.Module) -> None:
    model.train()
    for p in model.parameters():
        p.requires_grad_(True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(16, 4)).pow(2).mean().backward()
        opt.step()  # the grads of the last step stay on the model


def _look(model: nn.Module) -> tuple:
    return ({k: v.clone() for k, v in model.state_dict().items()},
            [p.grad for p in model.parameters()],
            [m.training for m in model.modules()],
            [p.requires_grad for p in model.parameters()])


def test_a_cold_build_leaves_the_model_as_a_cache_load_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pretrain, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(pretrain, "_memory", {})
    model = _model()
    rng = torch.get_rng_state()
    cold = _look(pretrain.pretrained("toy", model, _train))
    assert torch.equal(torch.get_rng_state(), rng)  # pre-training leaves the generator as found
    monkeypatch.setattr(pretrain, "_memory", {})  # the next build reads the disk
    warm = _look(pretrain.pretrained("toy", _model(), _train))
    assert cold[0].keys() == warm[0].keys()
    assert all(torch.equal(cold[0][k], warm[0][k]) for k in cold[0])
    assert cold[1] == warm[1] == [None] * 6
    assert cold[2] == warm[2] and not any(cold[2])
    assert cold[3] == warm[3] == [False, True, True, True, True, True]
