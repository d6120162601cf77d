"""Data ordered by label (a loader without shuffling over data stored class by class) is told
from the batches the inspector describes; shuffled, skewed, small and grouped-by-task batches
are not."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainguard import Guard, GuardConfig
from trainguard.diagnose.batch import describe_batch
from trainguard.diagnose.batch_label_order import LabelOrder

QUIET = {"sinks": {"console": False}, "probes": {"preflight": False}}


def _told(batches: list[object]) -> list[int]:
    order = LabelOrder()
    return [i for i, batch in enumerate(batches) if order.observe(describe_batch(batch), i)]


def _xy(labels: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(len(labels), 4), torch.tensor(labels)


def test_single_label_batches_of_two_classes_are_told_once() -> None:
    batches = [_xy([0] * 32), _xy([0] * 32), _xy([0] * 16 + [1] * 16), _xy([1] * 32),
               _xy([2] * 32), _xy([3] * 32)]
    assert _told(batches) == [4]  # the fifth: one mixed batch (a change of class) per four


def test_a_dict_batch_under_a_label_name() -> None:
    batches = [{"x": torch.randn(16, 4), "labels": torch.full((16,), c)} for c in (0, 0, 1)]
    assert _told(batches) == [2]


@pytest.mark.parametrize("case", ["shuffled", "skewed", "small", "task_ids", "mostly_mixed"])
def test_what_is_not_told(case: str) -> None:
    generator = torch.Generator().manual_seed(0)
    if case == "shuffled":
        batches = [_xy(torch.randint(0, 4, (32,), generator=generator).tolist())
                   for _ in range(50)]
    elif case == "skewed":  # the common class alone in most batches: no order
        batches = [_xy([0] * 32) for _ in range(40)] + [_xy([0] * 31 + [1])]
    elif case == "small":  # batches of 4 hold one class by chance
        batches = [_xy([c] * 4) for c in (0, 1, 2, 3)]
    elif case == "task_ids":  # batches grouped by task on purpose, under another name
        batches = [{"x": torch.randn(16, 4), "task_id": torch.full((16,), c),
                    "labels": torch.randint(0, 4, (16,), generator=generator)}
                   for c in (0, 1, 2, 0)]
    else:  # single-label batches now and then among many mixed ones
        batches = [_xy([0, 1] * 16) for _ in range(20)] + [_xy([c] * 32) for c in (0, 1, 2)]
    assert _told(batches) == []


def test_the_state_carries_over_a_resume() -> None:
    first = LabelOrder()
    for c in (0, 0):
        first.observe(describe_batch(_xy([c] * 32)), 0)
    second = LabelOrder()
    second.load_state_dict(first.state_dict())
    assert second.observe(describe_batch(_xy([1] * 32)), 5) is not None


def _train(shuffle: bool) -> Guard:
    torch.manual_seed(0)
    centers = torch.randn(4, 16) * 2
    y = torch.arange(4).repeat_interleave(512)  # stored class by class
    x = centers[y] + torch.randn(len(y), 16)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32,
                                         shuffle=shuffle)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET))
    for xb, yb in loader:
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        guard.step(loss, batch=(xb, yb))
        optimizer.zero_grad(set_to_none=True)
    return guard


def test_a_loader_without_shuffling_is_told_and_ranked_first() -> None:
    guard = _train(shuffle=False)
    told = [e for e in guard.events if e.kind == "batch_label_order"]
    assert len(told) == 1 and "'[1]'" in told[0].message
    assert guard.diagnose()[0].code == "unshuffled_data"
    guard.close()


def test_the_same_data_shuffled_is_not() -> None:
    guard = _train(shuffle=True)
    assert [e for e in guard.events if e.kind == "batch_label_order"] == []
    guard.close()
