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


def schedule_loop(steps: int, own_step: bool, *, load_at: int | None = None,
                  policy: str = "protect") -> tuple[Guard, list]:
    """The README's loop with a warmup scheduler given to the Guard; `own_step`: the loop also
    calls `scheduler.step()` (as it did before trainguard); `load_at`: the loop loads a
    checkpoint's scheduler state (far ahead) before that step."""
    model, optimizer = setup()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 50))
    ahead = torch.optim.lr_scheduler.LambdaLR(_optimizer(), lambda s: 1.0)
    for _ in range(200):
        ahead.optimizer.step()
        ahead.step()
    guard = Guard(model, optimizer, scheduler, config=GuardConfig(policy=policy, **QUIET))
    told = []
    for step in range(steps):
        if step == load_at:
            scheduler.load_state_dict(ahead.state_dict())
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        report = guard.step(loss)
        told += [e for e in report.events if e.kind == "scheduler_step_outside"]
        optimizer.zero_grad(set_to_none=True)
        if own_step:
            scheduler.step()
    guard.close()
    return guard, told


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)


def test_the_loops_own_scheduler_step_is_told_once_with_the_pace() -> None:
    guard, told = schedule_loop(20, own_step=True)
    [event] = [e for e in guard.events if e.kind == "scheduler_step_outside"]
    assert told == [event]  # with the step's report, as its other events
    assert event.step == 3 and event.severity == "warning"
    assert "runs 2x as fast" in event.message and "remove the loop's scheduler.step()" in (
        event.message)


def test_the_guard_stepping_its_scheduler_alone_or_a_loaded_checkpoint_is_not() -> None:
    for guard, _ in (schedule_loop(20, own_step=False),
                     schedule_loop(20, own_step=False, load_at=7),
                     schedule_loop(20, own_step=False, policy="observe")):
        assert [e for e in guard.events if e.kind == "scheduler_step_outside"] == []


def test_a_deferred_guard_concluding_its_step_between_calls_is_not_told() -> None:
    """Under sync="deferred", `state_dict` concludes the pending step, and with it steps the
    scheduler, between two calls: the Guard's own step."""
    model, optimizer = setup()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 50))
    guard = Guard(model, optimizer, scheduler, config=GuardConfig(sync="deferred", **QUIET))
    for _ in range(12):
        loss = nn.functional.mse_loss(model(torch.randn(16, 8)), torch.randn(16, 1))
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
        guard.state_dict()
    guard.close()
    assert [e for e in guard.events if e.kind == "scheduler_step_outside"] == []
    assert scheduler.last_epoch == 12
