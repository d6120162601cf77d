"""`unreached_params`: trainable parameters the optimizer holds that got no gradient at steps 0, 1
and the first sampled step are told once: a warning naming a layer cut off by a `.detach()`, an
info for a small idle piece; a branch used on alternate batches, a frozen layer, a run with no
gradient at all are not."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from trainguard import Guard, GuardConfig
from trainguard.diagnose.unreached_params import UnreachedParams
from trainguard.params import watched_params


class Net(nn.Module):
    """20-64-64-5; `cut`: the second layer reads the first's output detached; `idle`: a small
    layer the forward never calls; `alternate`: a branch added on odd calls only."""

    def __init__(self, cut: bool = False, idle: bool = False, alternate: bool = False) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(20, 64), nn.Linear(64, 64), nn.Linear(64, 5)
        self.idle = nn.Linear(4, 4) if idle else None
        self.branch = nn.Linear(64, 64) if alternate else None
        self.cut, self.calls = cut, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.a(x))
        h = F.relu(self.b(h.detach() if self.cut else h))
        self.calls += 1
        if self.branch is not None and self.calls % 2 == 0:
            h = h + self.branch(h)
        return self.c(h)


def _run(model: nn.Module, steps: int = 60, **config: Any) -> Guard:
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False}, **config))
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(512, 20, generator=generator)
    y = (x @ torch.randn(20, 5, generator=generator)).argmax(1)
    for _ in range(steps):
        i = torch.randint(0, 512, (64,), generator=generator)
        loss = F.cross_entropy(model(x[i]), y[i])
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    return guard


def _told(guard: Guard) -> list[Any]:
    return [f for f in guard.findings if f.check == "unreached_params"]


def test_a_layer_cut_off_by_a_detach_is_a_warning_that_names_it() -> None:
    torch.manual_seed(0)
    [finding] = _told(_run(Net(cut=True)))
    assert finding.severity == "warning" and finding.cause == "no_gradients"
    assert finding.evidence["params"] == ["a.weight", "a.bias"]
    assert finding.evidence["steps"] == [0, 1, 50]
    assert abs(finding.evidence["share"] - 1344 / 5829) < 1e-6
    assert "got no gradient at steps 0, 1 and 50" in finding.message


def test_a_small_idle_layer_is_an_info_without_a_cause() -> None:
    torch.manual_seed(0)
    [finding] = _told(_run(Net(idle=True)))
    assert finding.severity == "info" and finding.cause is None
    assert finding.evidence["params"] == ["idle.weight", "idle.bias"]


def test_a_branch_used_on_alternate_batches_is_not_told() -> None:
    torch.manual_seed(0)
    assert _told(_run(Net(alternate=True))) == []


def test_a_frozen_layer_is_not_told() -> None:
    torch.manual_seed(0)
    model = Net()
    model.a.requires_grad_(False)
    assert _told(_run(model)) == []


def test_steps_with_no_gradient_at_all_are_left_to_no_gradients() -> None:
    model = Net(cut=True)
    watched = watched_params(model, [torch.optim.SGD(model.parameters(), lr=0.1)])
    check = UnreachedParams()
    assert check.check(watched, 0) == [] and check.steps == []  # nothing has a gradient yet
    F.cross_entropy(model(torch.randn(8, 20)), torch.zeros(8, dtype=torch.long)).backward()
    for step in (1, 2):
        assert check.check(watched, step) == []
    [finding] = check.check(watched, 50)
    assert finding.evidence["steps"] == [1, 2, 50] and check.done
