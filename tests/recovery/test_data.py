"""Data the Guard blamed is really left out of later epochs."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from trainguard.recovery import SkippingSampler
from trainguard.recovery.data import flatten_ids

from .helpers import make_workload, recover_guard


def test_blamed_samples_never_come_back_in_later_epochs() -> None:
    w = make_workload()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=gen)
    y = x @ w.target
    y[[13, 77]] = float("nan")  # two corrupt samples
    dataset = TensorDataset(torch.arange(256), x, y)
    guard = recover_guard(w)
    sampler = SkippingSampler(RandomSampler(dataset, generator=gen), guard)
    loader = DataLoader(dataset, sampler=sampler, batch_size=16)
    seen_per_epoch = []
    for _ in range(3):
        seen: set[int] = set()
        for indices, xb, yb in loader:
            seen.update(indices.tolist())
            loss = torch.nn.functional.mse_loss(w.model(xb), yb)
            loss.backward()
            guard.step(loss, batch={"x": xb, "y": yb}, data_ids=indices)
            w.optimizer.zero_grad(set_to_none=True)
        seen_per_epoch.append(seen)
    assert {13, 77} <= seen_per_epoch[0]
    assert {13, 77} <= guard.skipped_data  # the whole batch of each is a suspect
    for seen in seen_per_epoch[1:]:
        assert not seen & guard.skipped_data
    assert all(torch.isfinite(p).all() for p in w.model.parameters())


def test_flatten_ids_accepts_tensors_lists_and_scalars() -> None:
    assert flatten_ids(torch.tensor([[1, 2], [3, 4]])) == [1, 2, 3, 4]
    assert flatten_ids([5, (6, 7)]) == [5, 6, 7]
    assert flatten_ids(9) == [9]
    assert flatten_ids(None) == []
