"""Data ordered by label (a loader without shuffling over data stored class by class) is told
from the batches the inspector describes; shuffled, skewed, small, bucketed-by-length and
grouped-by-task batches are not."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainguard import Guard, GuardConfig
from trainguard.diagnose.batch import describe_batch
from trainguard.diagnose.batch_label_order import LabelOrder
from trainguard.diagnose.ranking import rank_causes
from trainguard.events import Event

QUIET = {"sinks": {"console": False}, "probes": {"preflight": False}}


def _told(batches: list[object], fired: set[int] = frozenset()) -> list[int]:
    order = LabelOrder()
    return [i for i, batch in enumerate(batches)
            if order.observe(describe_batch(batch), i, i in fired)]


def _xy(labels: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(len(labels), 4), torch.tensor(labels)


def _sorted_batches(per_class: int, classes: int, size: int) -> list[object]:
    labels = torch.arange(classes).repeat_interleave(per_class)
    return [_xy(labels[i:i + size].tolist()) for i in range(0, len(labels), size)]


def test_single_label_batches_of_two_classes_are_told_once() -> None:
    batches = [_xy([0] * 32), _xy([0] * 32), _xy([0] * 16 + [1] * 16), _xy([1] * 32),
               _xy([2] * 32), _xy([3] * 32)]
    assert _told(batches) == [4]  # the fifth: one mixed batch (a change of class) per four


def test_a_mixed_batch_inspected_for_its_event_is_not_counted_as_wide() -> None:
    batches = [_xy([0] * 32), _xy([0] * 32), _xy([0] * 16 + [1] * 16), _xy([1] * 32)]
    assert _told(batches) == []
    assert _told(batches, fired={2}) == [3]


def test_many_classes_in_batches_of_a_few_neighbours_are_told() -> None:
    """Sorted data shaped like CIFAR-100 (500 a class, batches of 128): every batch holds one
    or two classes, and most hold two."""
    batches = _sorted_batches(500, 100, 128)[::7]  # inspected now and then
    assert _told(batches) != []


@pytest.mark.parametrize("batch_of", ["tuple_of_dict", "dict_labels", "column"])
def test_the_label_field_is_found(batch_of: str) -> None:
    def batch(c: int) -> object:
        if batch_of == "tuple_of_dict":
            return {"x": torch.randn(16, 4)}, torch.full((16,), c)
        if batch_of == "dict_labels":
            return {"x": torch.randn(16, 4), "labels": torch.full((16,), c)}
        return torch.randn(16, 4), torch.full((16, 1), c)

    assert _told([batch(c) for c in (0, 0, 1)]) == [2]


@pytest.mark.parametrize("case", ["shuffled", "skewed", "small", "task_ids", "task_last",
                                  "lengths", "mostly_mixed", "hundred_shuffled"])
def test_what_is_not_told(case: str) -> None:
    generator = torch.Generator().manual_seed(0)

    def shuffled(size: int, classes: int = 4) -> torch.Tensor:
        return torch.randint(0, classes, (size,), generator=generator)

    if case == "shuffled":
        batches: list[object] = [_xy(shuffled(32).tolist()) for _ in range(50)]
    elif case == "skewed":  # the common class alone in most batches: one place, no order
        batches = [_xy([0] * 32) for _ in range(40)] + [_xy([0] * 31 + [1])]
    elif case == "small":  # batches of 4 hold one class by chance
        batches = [_xy([c] * 4) for c in (0, 1, 2, 3)]
    elif case == "task_ids":  # batches grouped by task on purpose, under another name
        batches = [{"x": torch.randn(16, 4), "task_id": torch.full((16,), c),
                    "labels": shuffled(16)} for c in (0, 1, 2, 0)]
    elif case == "task_last":  # (x, y, task): the task is the third element
        batches = [(torch.randn(16, 4), shuffled(16), torch.full((16,), c))
                   for c in (0, 1, 2, 0, 1, 2)]
    elif case == "lengths":  # (tokens, lengths) bucketed by length: one length a batch
        batches = [(torch.zeros(16, n, dtype=torch.long), torch.full((16,), n))
                   for n in (5, 9, 12, 5, 9)]
    elif case == "mostly_mixed":  # single-label batches now and then among many mixed ones
        batches = [_xy([0, 1] * 16) for _ in range(20)] + [_xy([c] * 32) for c in (0, 1, 2)]
    else:
        batches = [_xy(shuffled(8, 100).tolist()) for _ in range(200)]
    assert _told(batches) == []


def test_the_state_carries_over_a_resume() -> None:
    first = LabelOrder()
    for c in (0, 0):
        first.observe(describe_batch(_xy([c] * 32)), 0, False)
    second = LabelOrder()
    second.load_state_dict(first.state_dict())
    assert second.observe(describe_batch(_xy([1] * 32)), 5, False) is not None


def _train(shuffle: bool) -> Guard:
    torch.manual_seed(0)
    centers = torch.randn(4, 16) * 2
    y = torch.arange(4).repeat_interleave(500)  # stored class by class
    x = centers[y] + torch.randn(len(y), 16)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32,
                                         shuffle=shuffle)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET))
    for _ in range(2):
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


def _event(kind: str, step: int, severity: str = "warning", **details: object) -> Event:
    return Event(kind=kind, step=step, severity=severity, message=kind,  # type: ignore[arg-type]
                 details=details)


ORDER = _event("batch_label_order", 150, cause="unshuffled_data")


@pytest.mark.parametrize(("symptoms", "weighed_down"), [
    ([_event("loss_divergence", 60, "error")], True),
    ([_event("grad_explosion", 0, "error")], False),  # the first step saw one batch
    ([_event("loss_spike", 40, "error"), _event("nonfinite_loss", 45, "error")],
     False),  # no order makes a NaN
])
def test_the_order_weighs_the_configuration_down_only_where_it_can_explain(
        symptoms: list[Event], weighed_down: bool) -> None:
    first = rank_causes(symptoms)[0]  # the LR, the initialisation, a numerical op

    def score(events: list[Event]) -> float:
        return next(c.score for c in rank_causes(events, top=30) if c.code == first.code)

    with_order = score([*symptoms, ORDER])
    assert (with_order < first.score) == weighed_down
    assert with_order <= first.score


@pytest.mark.parametrize("skew", ["one_class_97", "zipf_1000"])
def test_shuffled_skewed_labels_are_not_told(skew: str) -> None:
    """Skewed labels give narrow batches around their common classes, and single-label ones
    of the most common class only."""
    for seed in range(10):
        generator = torch.Generator().manual_seed(seed)
        if skew == "one_class_97":
            weights = torch.full((20,), 0.03 / 19)
            weights[10] = 0.97
        else:
            weights = 1.0 / torch.arange(1, 1001).float() ** 1.5
        batches = [_xy(torch.multinomial(weights, 8, replacement=True,
                                         generator=generator).tolist()) for _ in range(64)]
        assert _told(batches) == [], seed
