"""A loop that still calls `optimizer.step()` next to `guard.step` is told once, by name."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from trainguard import Guard, GuardConfig

QUIET = {"sinks": {"console": False}, "probes": {"preflight": False}}


def loop(guard: Guard, model: nn.Module, optimizer: torch.optim.Optimizer, steps: int,
         own_step: bool = False, before: bool = False) -> None:
    for _ in range(steps):
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        nn.functional.mse_loss(model(x), y).backward()
        if own_step and before:
            optimizer.step()
        guard.step(nn.functional.mse_loss(model(x), y).detach())
        if own_step and not before:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def setup() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def outside(guard: Guard) -> list:
    return [e for e in guard.events if e.kind == "optimizer_step_outside"]


def test_the_loops_own_optimizer_step_is_named_once_with_the_fix(tmp_path: Path) -> None:
    for before in (False, True):
        model, optimizer = setup()
        guard = Guard(model, optimizer, config=GuardConfig(**QUIET), run_dir=tmp_path / "run")
        loop(guard, model, optimizer, 20, own_step=True, before=before)
        guard.close()
        [event] = outside(guard)
        assert event.step == (0 if before else 1) and event.severity == "warning"
        assert "remove the loop's optimizer.step()" in event.message


def guard_with_replay(model: nn.Module, optimizer: torch.optim.Optimizer,
                      run_dir: Path) -> Guard:
    """A Guard that can prove steps between them (`guard.prove`), whose replays take steps
    and run backward passes of their own."""

    def replay(model: nn.Module, batch: dict) -> torch.Tensor:
        return nn.functional.mse_loss(model(batch["x"]), batch["y"])

    return Guard(model, optimizer, config=GuardConfig(**QUIET), run_dir=run_dir,
                 replay_fn=replay)


def test_the_readme_loop_and_a_proof_between_steps_are_not_outside_steps(tmp_path: Path) -> None:
    model, optimizer = setup()
    guard = guard_with_replay(model, optimizer, tmp_path / "run")
    loop(guard, model, optimizer, 10)
    guard.prove({"x": torch.randn(16, 8), "y": torch.randn(16, 1)})  # replays take steps
    loop(guard, model, optimizer, 10)
    guard.close()
    assert outside(guard) == []
    assert not optimizer._optimizer_step_post_hooks  # closing the Guard removed its hooks
