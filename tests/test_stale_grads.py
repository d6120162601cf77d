"""A loop that never clears its gradients is told once, by name; every way of clearing is quiet."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from trainguard import Guard, GuardConfig
from trainguard.stale_grads import EVERY

from .test_outside_steps import guard_with_replay

QUIET = {"sinks": {"console": False}, "probes": {"preflight": False}}
Clear = Callable[[nn.Module, torch.optim.Optimizer], None]


def setup() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def loop(guard: Guard, model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, *,
         clear_after: Clear | None = None, clear_before: Clear | None = None,
         micro: int = 1) -> None:
    for _ in range(steps):
        for _ in range(micro):
            x, y = torch.randn(16, 8), torch.randn(16, 1)
            loss = nn.functional.mse_loss(model(x), y)
            if clear_before is not None:
                clear_before(model, optimizer)
            (loss / micro).backward()
        guard.step(loss.detach())
        if clear_after is not None:
            clear_after(model, optimizer)


def stale(guard: Guard) -> list:
    return [e for e in guard.events if e.kind == "grads_not_cleared"]


def test_a_loop_without_zero_grad_is_told_once_with_the_fix_and_the_cause(
        tmp_path: Path) -> None:
    model, optimizer = setup()
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET), run_dir=tmp_path / "run")
    loop(guard, model, optimizer, 12)
    [event] = stale(guard)
    assert event.step == 1 and event.severity == "error" and event.param == "2.bias"
    assert "optimizer.zero_grad(set_to_none=True)" in event.message
    assert guard.diagnose()[0].code == "grads_not_cleared"
    guard.close()


@pytest.mark.parametrize("how", ["to_none", "zeroed", "model", "before_backward", "by_hand",
                                 "accumulating", "through_data", "extra_backward_first",
                                 "autograd_grad_first", "functional"])
def test_every_way_of_clearing_the_gradients_is_quiet(tmp_path: Path, how: str) -> None:
    model, optimizer = setup()
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET), run_dir=tmp_path / "run")

    def by_hand(m: nn.Module, _: torch.optim.Optimizer) -> None:
        for p in m.parameters():
            p.grad = None

    def through_data(m: nn.Module, _: torch.optim.Optimizer) -> None:
        for p in m.parameters():  # the old idiom: moves no version counter
            p.grad.data.zero_()

    def extra_backward_first(m: nn.Module, o: torch.optim.Optimizer) -> None:
        # a second loss's backward before the loop clears (a GAN's discriminator pass, a
        # logging pass): it adds to the last step's gradients, which the clearing then drops
        m(torch.randn(4, 8)).sum().backward()
        o.zero_grad()

    def autograd_grad_first(m: nn.Module, o: torch.optim.Optimizer) -> None:
        # a gradient probe through torch.autograd.grad (adds nothing to .grad), then the clearing
        torch.autograd.grad(m(torch.randn(4, 8)).pow(2).mean(), list(m.parameters()))
        o.zero_grad(set_to_none=False)

    clears: dict[str, dict] = {
        "to_none": {"clear_after": lambda _, o: o.zero_grad(set_to_none=True)},
        "zeroed": {"clear_after": lambda _, o: o.zero_grad(set_to_none=False)},
        "model": {"clear_after": lambda m, _: m.zero_grad()},
        "before_backward": {"clear_before": lambda _, o: o.zero_grad()},
        "by_hand": {"clear_after": by_hand},
        "accumulating": {"clear_after": lambda _, o: o.zero_grad(), "micro": 4},
        "through_data": {"clear_after": through_data},
        "extra_backward_first": {"clear_after": extra_backward_first},
        "autograd_grad_first": {"clear_after": autograd_grad_first},
    }
    if how == "functional":  # gradients from torch.autograd.grad, assigned: nothing adds
        for _ in range(12):
            loss = nn.functional.mse_loss(model(torch.randn(16, 8)), torch.randn(16, 1))
            params = list(model.parameters())
            for p, grad in zip(params, torch.autograd.grad(loss, params), strict=True):
                p.grad = grad
            guard.step(loss.detach())
    else:
        loop(guard, model, optimizer, 12, **clears[how])
    guard.close()
    assert stale(guard) == []


def test_a_proof_between_steps_is_not_the_loop_forgetting(tmp_path: Path) -> None:
    model, optimizer = setup()
    guard = guard_with_replay(model, optimizer, tmp_path / "run")
    clear = {"clear_after": lambda _, o: o.zero_grad(set_to_none=False)}
    loop(guard, model, optimizer, 5, **clear)
    guard.prove({"x": torch.randn(16, 8), "y": torch.randn(16, 1)})
    loop(guard, model, optimizer, 5, **clear)
    guard.close()
    assert stale(guard) == []


def test_the_hook_leaves_the_gradients_and_the_weights_as_they_were(tmp_path: Path) -> None:
    """`observe` with the hook in place trains bit for bit as the loop alone, and the hook is
    gone once the Guard is closed."""
    runs = []
    for guarded in (False, True):
        model, optimizer = setup()
        guard = (Guard(model, optimizer, config=GuardConfig(policy="observe", **QUIET),
                       run_dir=tmp_path / "run") if guarded else None)
        for _ in range(10):
            nn.functional.mse_loss(model(torch.ones(4, 8)), torch.zeros(4, 1)).backward()
            if guard is not None:
                guard.step(None)
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=False)
        if guard is not None:
            assert model[2].bias._backward_hooks  # step 10 is checked
            guard.close()
            assert not model[2].bias._backward_hooks
        runs.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_a_loop_that_stops_clearing_mid_run_is_told_within_the_checks_cadence(
        tmp_path: Path) -> None:
    model, optimizer = setup()
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET), run_dir=tmp_path / "run")
    loop(guard, model, optimizer, 23, clear_after=lambda _, o: o.zero_grad())
    loop(guard, model, optimizer, 15)  # its zero_grad() no longer runs
    [event] = stale(guard)
    assert 23 < event.step <= 23 + EVERY
    assert not model[2].bias._backward_hooks  # told once: the hook is gone
    guard.close()


def test_a_parameter_of_no_elements_is_not_the_one_watched(tmp_path: Path) -> None:
    model, _ = setup()
    model.register_parameter("empty", nn.Parameter(torch.zeros(0)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET), run_dir=tmp_path / "run")
    for _ in range(3):
        x = torch.randn(16, 8)
        (nn.functional.mse_loss(model(x), torch.randn(16, 1)) + model.empty.sum()).backward()
        guard.step(None)
    [event] = stale(guard)
    assert event.param == "2.bias"
    guard.close()
