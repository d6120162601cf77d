"""`weight_decay_coupled`: a weight decay added to the gradient of an optimizer that normalises
it is told when the term weighs half the gradient or more on the typical parameter, at the first
two steps; AdamW's decay, SGD's, Adam's decoupled one and the usual small L2 are not."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainguard import Guard, GuardConfig
from trainguard.diagnose.coupled_decay import CoupledDecay, coupled_rows


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(4096, 20, generator=generator)
    return x, (x @ torch.randn(20, 5, generator=generator)).argmax(1)


def _backward(model: nn.Module) -> None:
    x, y = _data()
    F.cross_entropy(model(x[:64]), y[:64]).backward()


def _checked(make: Any, steps: tuple[int, ...] = (0, 50)) -> tuple[CoupledDecay, list[Any]]:
    model = _mlp()
    optimizer = make(model.parameters())
    check, found = CoupledDecay(), []
    for step in steps:
        optimizer.zero_grad()
        _backward(model)
        found += check.check([optimizer], step)
    return check, found


def test_adam_whose_l2_term_outweighs_the_gradient_is_told() -> None:
    check, found = _checked(lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=1.0))
    [finding] = found
    assert finding.cause == "weight_decay_coupled" and finding.severity == "warning"
    assert finding.message.startswith("Adam adds weight_decay 1 to the gradient")
    assert all(r >= 5.0 for r in finding.evidence["ratios"]) and check.done
    assert check.check([torch.optim.Adam(_mlp().parameters())], 100) == []  # once


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=1.0),
    lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=1.0, decoupled_weight_decay=True),
    lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.5),
    lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=1e-4),
    lambda p: torch.optim.Adam(p, lr=1e-3),
], ids=["adamw", "adam_decoupled", "sgd", "adam_small_l2", "adam_no_decay"])
def test_decoupled_plain_or_small_decays_are_not_told(make: Any) -> None:
    check, found = _checked(make)
    assert found == [] and check.done


def test_one_step_over_the_share_is_not_enough() -> None:
    """Judged at two steps: a gradient that is large at one of them leaves the term under the
    share there, and nothing is told."""
    model = _mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1.0)
    check = CoupledDecay()
    _backward(model)
    for p in model.parameters():
        p.grad.mul_(1e3)  # type: ignore[union-attr]
    assert check.check([optimizer], 0) == []
    optimizer.zero_grad()
    _backward(model)
    assert check.check([optimizer], 50) == [] and check.done


def test_only_groups_with_a_coupled_decay_and_a_gradient_are_read() -> None:
    model = _mlp()
    optimizer = torch.optim.Adam([{"params": model[0].parameters(), "weight_decay": 0.1},
                                  {"params": model[2].parameters()}], lr=1e-3)
    _backward(model)
    rows = coupled_rows([optimizer])
    assert [(name, group, decay) for name, group, decay, _ in rows] == [("Adam", 0, 0.1)] * 2


def _guarded(weight_decay: float) -> Guard:
    model = _mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=weight_decay)
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False}))
    x, y = _data()
    generator = torch.Generator().manual_seed(2)
    for _ in range(120):
        i = torch.randint(0, 4096, (64,), generator=generator)
        loss = F.cross_entropy(model(x[i]), y[i])
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    return guard


def test_a_guarded_loop_with_adam_given_adamws_decay_names_it() -> None:
    guard = _guarded(0.1)
    [finding] = [f for f in guard.findings if f.check == "weight_decay_coupled"]
    assert finding.evidence["steps"] == [0, 1]
    assert guard.diagnose()[0].code == "weight_decay_coupled"


def test_a_guarded_loop_with_the_usual_decay_is_quiet() -> None:
    guard = _guarded(0.01)
    assert [f for f in guard.findings if f.check == "weight_decay_coupled"] == []


def test_gradients_of_zero_end_the_check_at_once() -> None:
    """Nothing to weigh the decay against: the check is done, not repeated at every step."""
    model = _mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1.0)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    check = CoupledDecay()
    assert check.check([optimizer], 0) == [] and check.done and check.medians == []
