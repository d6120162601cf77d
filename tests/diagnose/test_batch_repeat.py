"""The same batch at each of the first steps (a loader re-created inside the loop) is an info,
told once; batches that differ, or repeat only epoch after epoch, are not."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from trainguard import Guard, GuardConfig
from trainguard.diagnose.batch import describe_batch
from trainguard.diagnose.batch_repeat import BatchRepeat

QUIET = {"sinks": {"console": False}, "probes": {"preflight": False}}
DATA = [(torch.randn(16, 4, generator=torch.Generator().manual_seed(i)),
         torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(i)))
        for i in range(4)]


def run(batch_at, steps: int = 12) -> Guard:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET))
    for step in range(steps):
        x, y = batch_at(step)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        guard.step(loss, batch=(x, y))
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    return guard


def repeated(guard: Guard) -> list:
    return [e for e in guard.events if e.kind == "batch_repeated"]


def test_the_first_batch_at_every_step_is_told_once_as_an_info() -> None:
    guard = run(lambda step: (DATA[0][0].clone(), DATA[0][1].clone()))  # a new copy each time
    [event] = repeated(guard)
    assert (event.step, event.severity) == (2, "info")
    assert "next(iter(loader))" in event.message
    assert not guard.run.state.batches.following  # no longer inspected step after step


def test_batches_that_differ_or_repeat_epoch_after_epoch_are_not() -> None:
    assert repeated(run(lambda step: DATA[step % 4])) == []
    assert repeated(run(lambda step: DATA[step % 2])) == []  # steps 0, 2, 4: one batch each


def test_the_same_values_in_another_order_are_another_batch() -> None:
    """A sorting task: each batch's rows are permutations of the same values, its labels a
    balanced set in another order; range, mean and spread alike, the order (the checksum)
    not."""
    watch, found = BatchRepeat(), []
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x = torch.stack([torch.randperm(4, generator=g) for _ in range(16)]).float()
        found.append(watch.observe(describe_batch((x, torch.randperm(16, generator=g) % 2)),
                                   step))
    assert found == [None, None, None] and not watch.watching


def test_a_batch_without_tensors_holds_nothing_shut() -> None:
    watch = BatchRepeat()
    assert watch.observe([], 0) is None and not watch.watching


def test_a_batch_with_a_nan_compares_by_its_count() -> None:
    x = DATA[0][0].clone()
    x[0, 0] = float("nan")
    watch = BatchRepeat()
    found = [watch.observe(describe_batch((x, DATA[0][1])), step) for step in range(3)]
    assert found[:2] == [None, None] and found[2] is not None


def test_a_resumed_run_does_not_watch() -> None:
    watch = BatchRepeat()
    watch.load_state_dict(BatchRepeat().state_dict())
    assert not watch.watching
