"""Parameters that join the run late are watched from their first step: a group added with
`optimizer.add_param_group` (a backbone unfrozen mid-run) and layers a `ProgressiveUnfreezer`
thaws are clipped, skipped and named like the rest, and the store keeps their columns apart."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

import trainguard
from trainguard import Guard, GuardConfig
from trainguard.recipes import ProgressiveUnfreezer

QUIET = {"sinks": {"console": False}, "probes": {"preflight": False}}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def head_only() -> tuple[Net, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Net()
    for p in model.backbone.parameters():
        p.requires_grad_(False)
    return model, torch.optim.AdamW(model.head.parameters(), lr=1e-3)


def train_step(guard: Guard, model: Net, optimizer: torch.optim.Optimizer,
               poison: float | None = None) -> trainguard.StepReport:
    x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    if poison is not None:
        model.backbone[0].weight.grad.fill_(poison)
    report = guard.step(loss)
    optimizer.zero_grad(set_to_none=True)
    return report


def unfreeze_backbone(model: Net, optimizer: torch.optim.Optimizer) -> None:
    for p in model.backbone.parameters():
        p.requires_grad_(True)
    optimizer.add_param_group({"params": list(model.backbone.parameters()), "lr": 1e-4})


def test_a_nan_gradient_in_an_added_group_is_skipped_and_named(tmp_path: Path) -> None:
    model, optimizer = head_only()
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET), run_dir=tmp_path / "run")
    for _ in range(5):
        train_step(guard, model, optimizer)
    unfreeze_backbone(model, optimizer)
    train_step(guard, model, optimizer)
    weights = model.backbone[0].weight.detach().clone()
    report = train_step(guard, model, optimizer, poison=math.nan)
    assert report.action == "skipped"
    assert any(e.kind == "nonfinite_grad" and e.param == "backbone.0.weight"
               for e in report.events)
    assert torch.equal(model.backbone[0].weight, weights), "the NaN update was not applied"
    assert train_step(guard, model, optimizer).action in ("applied", "clipped")
    guard.close()

    reader = trainguard.RunReader(tmp_path / "run")
    names = reader.param_names()
    assert names[:2] == ["head.weight", "head.bias"]
    assert set(names[2:]) == {"backbone.0.weight", "backbone.0.bias"}
    _, norms = reader.param_grad_norms()
    assert norms.shape == (8, 4)
    assert (norms[:5, 2:] == 0).all(), "not watched yet: no gradient"
    assert (norms[5, 2:] > 0).all()
    assert np.isnan(norms[6, names.index("backbone.0.weight")])
    watch = [a for a in reader.actions() if a.kind == "watch"]
    assert len(watch) == 1 and watch[0].step == 5


def test_a_huge_gradient_in_an_added_group_is_clipped() -> None:
    model, optimizer = head_only()
    guard = Guard(model, optimizer, config=GuardConfig(clip={"max_grad_norm": 1.0}, **QUIET))
    for _ in range(3):
        train_step(guard, model, optimizer)
    unfreeze_backbone(model, optimizer)
    before = model.backbone[0].weight.detach().clone()
    report = train_step(guard, model, optimizer, poison=1e4)  # a norm of ~1e5
    assert report.grad_norm > 1e5
    assert report.action == "clipped" and report.clip_coef < 1e-4
    # AdamW's first update moves each weight by about lr whatever the gradient's scale; what
    # the clip shows is that the moment holds the clipped gradient, not the 1e4 one
    state = optimizer.state[model.backbone[0].weight]
    assert state["exp_avg"].abs().max() < 1.0
    assert not torch.equal(model.backbone[0].weight, before)
    guard.close()


def test_the_recover_policy_keeps_good_states_of_the_new_groups() -> None:
    model, optimizer = head_only()
    guard = Guard(model, optimizer, config=GuardConfig(policy="recover", **QUIET))
    for _ in range(3):
        train_step(guard, model, optimizer)
    unfreeze_backbone(model, optimizer)
    for _ in range(3):
        train_step(guard, model, optimizer)
    guard.rollback("test")  # restores a state that holds both groups
    assert len(optimizer.param_groups) == 2
    assert train_step(guard, model, optimizer).action in ("applied", "clipped")
    guard.close()


def test_layers_a_progressive_unfreezer_thaws_are_watched_from_their_first_step() -> None:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    unfreezer = ProgressiveUnfreezer(model, ["backbone", "head"], total_steps=20,
                                     top_fraction=0.25, optimizer=optimizer)
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET))
    assert "backbone.0.weight" in guard.run.watched.names
    poisoned = None
    for step in range(12):
        unfreezer.step(step)
        frozen = not model.backbone[0].weight.requires_grad
        poison = math.nan if (not frozen and poisoned is None) else None
        if poison is not None:
            poisoned = step
        report = train_step(guard, model, optimizer, poison=poison)
        if step == poisoned:
            assert report.action == "skipped"
            assert any(e.kind == "nonfinite_grad" and e.param == "backbone.0.weight"
                       for e in report.events)
    assert poisoned is not None and poisoned >= 5
    guard.close()


def test_the_rebuilt_probes_leave_one_pair_of_optimizer_hooks_and_close_removes_it(
        tmp_path: Path) -> None:
    """The Adam ratio probe hooks the optimizer's step; rebuilding it for an added group must not
    pile up hooks, and closing the guard leaves the optimizer as it found it."""
    model, optimizer = head_only()
    # the probe measures every step, so its hooks are in place from the first steps on
    every_step = {"instability_precursor": {"every": 1}}
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET, detectors=every_step),
                  run_dir=tmp_path / "run")
    counts = []
    for step in range(12):
        if step == 6:
            unfreeze_backbone(model, optimizer)
        train_step(guard, model, optimizer)
        counts.append((len(optimizer._optimizer_step_pre_hooks),
                       len(optimizer._optimizer_step_post_hooks)))
    assert counts[-1] == counts[3] and counts[3][0] == 1
    guard.close()
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
