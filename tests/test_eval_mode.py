"""A model trained in eval mode (an evaluation's `model.eval()` never undone, or a model that
starts in eval mode) is told once, with what it turns off."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from trainguard import Guard, GuardConfig
from trainguard.eval_mode import mode_dependent

QUIET = {"sinks": {"console": False}, "probes": {"preflight": False}}


def model_with(*layers: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), *layers, nn.ReLU(), nn.Linear(16, 3))


def train(model: nn.Module, tmp_path: Path, steps: int = 30, *, eval_at: int | None = None,
          restore: bool = False, eval_from_start: bool = False) -> tuple[Guard, list]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET), run_dir=tmp_path / "run")
    model.train(not eval_from_start)
    reported = []
    for step in range(steps):
        x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        report = guard.step(loss)
        reported.extend(e for e in report.events if e.kind == "model_in_eval_mode")
        optimizer.zero_grad(set_to_none=True)
        if step == eval_at:  # an evaluation
            was = model.training
            model.eval()
            with torch.no_grad():
                model(torch.randn(4, 8))
            if restore:
                model.train(was)
    guard.close()
    return guard, reported


def told(guard: Guard) -> list:
    return [e for e in guard.events if e.kind == "model_in_eval_mode"]


def test_an_evaluation_that_leaves_the_model_in_eval_mode_is_a_warning_at_the_next_step(
        tmp_path: Path) -> None:
    guard, reported = train(model_with(nn.BatchNorm1d(16), nn.Dropout(0.1)), tmp_path,
                            eval_at=9)
    [event] = told(guard)
    # found in eval mode at step 10; told when step 11's forward ran in eval mode too
    assert event.step == 11 and event.severity == "warning"
    assert event.details["since"] == 10 and "found so at step 10" in event.message
    assert "dropout (1 layer) is off" in event.message
    assert "batch norm (1 layer) normalises with running statistics" in event.message
    assert "model.train()" in event.message
    assert reported == [event]  # with the step's report, where a loop that prints them sees it
    assert guard.diagnose()[0].code == "model_in_eval_mode"
    assert guard.verdict.verdict == "healthy"  # no trouble the loss came back from


def test_a_loop_that_switches_back_after_its_evaluation_hears_nothing(tmp_path: Path) -> None:
    guard, _ = train(model_with(nn.BatchNorm1d(16), nn.Dropout(0.1)), tmp_path, eval_at=9,
                     restore=True)
    assert told(guard) == []


def test_from_the_first_step_dropout_alone_is_an_info_batch_norm_a_warning(
        tmp_path: Path) -> None:
    guard, _ = train(model_with(nn.Dropout(0.1)), tmp_path / "a", eval_from_start=True)
    [event] = told(guard)
    assert (event.step, event.severity) == (1, "info")
    assert "from the first step this Guard checked" in event.message
    assert "batch norm" not in event.message
    guard, _ = train(model_with(nn.BatchNorm1d(16)), tmp_path / "b", eval_from_start=True)
    [event] = told(guard)
    assert (event.step, event.severity) == (1, "warning")


def test_an_evaluation_between_the_backward_and_the_step_is_no_fault(tmp_path: Path) -> None:
    """`model.train()` at the top of each step, an evaluation after the backward: every
    `Guard.step` finds the model in eval mode, every forward ran in train mode."""
    model = model_with(nn.BatchNorm1d(16), nn.Dropout(0.1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET), run_dir=tmp_path / "run")
    for _ in range(12):
        model.train()
        loss = F.cross_entropy(model(torch.randn(32, 8)), torch.randint(0, 3, (32,)))
        loss.backward()
        model.eval()
        with torch.no_grad():
            model(torch.randn(4, 8))
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    assert told(guard) == []
    assert not model._forward_pre_hooks  # the watch is gone with the Guard


def test_a_model_whose_forward_ignores_the_mode_is_not_told(tmp_path: Path) -> None:
    class FrozenBatchNorm(nn.BatchNorm1d):  # its own forward: the same in either mode
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                training=False)

    for layers in ((), (nn.Dropout(0.0),), (FrozenBatchNorm(16),),
                   (nn.BatchNorm1d(16, track_running_stats=False),)):
        guard, _ = train(model_with(*layers), tmp_path / str(len(list(tmp_path.iterdir()))),
                         eval_at=5)
        assert told(guard) == []


def test_batch_norm_frozen_by_the_loop_under_a_model_in_train_mode_is_not_told(
        tmp_path: Path) -> None:
    model = model_with(nn.BatchNorm1d(16), nn.Dropout(0.1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET), run_dir=tmp_path / "run")
    model.train()
    model[1].eval()  # the usual way to freeze its statistics while fine-tuning
    for _ in range(12):
        loss = F.cross_entropy(model(torch.randn(32, 8)), torch.randint(0, 3, (32,)))
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    assert told(guard) == []


def test_the_modules_counted() -> None:
    model = nn.Sequential(nn.Dropout(0.2), nn.Dropout2d(0.0), nn.BatchNorm2d(3),
                          nn.InstanceNorm2d(3), nn.InstanceNorm2d(3, track_running_stats=True),
                          nn.AlphaDropout(0.1), nn.LayerNorm(3))
    assert mode_dependent(model) == (["0", "5"], ["2", "4"])


class Wrapped(nn.Module):
    """A model inside a user's module (as a LoRA wrapper or a task head holds it)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.1), nn.ReLU())
        self.head = nn.Sequential(nn.Dropout(0.1), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def run_loop(model: nn.Module, tmp_path: Path, before_step, steps: int = 14,
             forward=None, replay: bool = False) -> Guard:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET), run_dir=tmp_path / "run",
                  replay_fn=(lambda m, b: F.cross_entropy(m(b[0]), b[1])) if replay else None)
    for step in range(steps):
        before_step(step)
        x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
        loss = F.cross_entropy((forward or model)(x), y)
        loss.backward()
        guard.step(loss, batch=(x, y) if replay else None)
        optimizer.zero_grad(set_to_none=True)
        if replay:
            guard.prove((x, y))  # its replays run forwards in train mode: not the loop's
    guard.close()
    return guard


def test_a_model_in_eval_mode_inside_a_wrapper_in_train_mode_is_told(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Wrapped()
    model.body.eval()  # from_pretrained's eval mode, under a wrapper whose own root trains
    guard = run_loop(model, tmp_path, lambda step: None)
    [event] = told(guard)
    assert (event.step, event.severity, event.details["dropout_layers"]) == (1, "info", 1)


def test_a_loop_that_calls_the_submodules_itself_is_told(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Wrapped()
    guard = run_loop(model, tmp_path, lambda step: model.eval() if step == 5 else None,
                     forward=lambda x: model.head(model.body(x)))
    [event] = told(guard)
    assert (event.step, event.severity) == (6, "warning")


def test_a_frozen_backbone_set_to_eval_by_the_loop_is_not_told(tmp_path: Path) -> None:
    """Linear probing: the backbone frozen with its batch norm's statistics, the head trains."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.1),
                                        nn.ReLU()),
                          nn.Sequential(nn.Dropout(0.1), nn.Linear(16, 3)))
    for p in model[0].parameters():
        p.requires_grad_(False)

    def probe_mode(step: int) -> None:
        model.eval()
        model[1].train()

    assert told(run_loop(model, tmp_path, probe_mode)) == []


def test_an_evaluation_at_the_first_step_is_no_model_in_eval_mode_from_the_start(
        tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = model_with(nn.Dropout(0.1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET), run_dir=tmp_path / "run")
    model.train()  # at the top of the epoch only
    for step in range(6):
        loss = F.cross_entropy(model(torch.randn(32, 8)), torch.randint(0, 3, (32,)))
        loss.backward()
        if step == 0:  # an evaluation between the backward and the step
            model.eval()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    [event] = told(guard)
    assert (event.step, event.severity) == (1, "warning")
    assert event.details["trained_in_train_mode"]


def test_the_guards_own_replays_do_not_hide_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = model_with(nn.Dropout(0.1))
    guard = run_loop(model, tmp_path, lambda step: model.eval() if step == 4 else None,
                     replay=True)
    [event] = told(guard)
    assert event.step == 5
