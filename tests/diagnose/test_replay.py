"""Replay names the module and parameter where a planted fault starts, as a manual search does."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import trainguard
from trainguard.diagnose.replay import replay
from trainguard.errors import SnapshotError

from ..conftest import make_setup


def lm_loss(model, batch):
    return model.loss(batch)


def manual_culprit_parameter(model, batch) -> str:
    """The guide's manual search: repair one parameter at a time until the loss is finite."""
    for name, param in model.named_parameters():
        if torch.isfinite(param).all():
            continue
        repaired = copy.deepcopy(model)
        with torch.no_grad():
            target = dict(repaired.named_parameters())[name]
            target.copy_(torch.nan_to_num(target, nan=0.0))
        if math.isfinite(float(lm_loss(repaired, batch).detach())):
            return name
    raise AssertionError("no single parameter explains the NaN")


def test_a_nan_planted_in_a_known_layer_is_named_in_the_forward() -> None:
    setup = make_setup()
    batch = setup.batch()
    culprit = "blocks.layers.1.linear1"
    with torch.no_grad():
        dict(setup.model.named_modules())[culprit].weight[3, 5] = float("nan")
    report = replay(setup.model, batch, lm_loss)
    hit = report.first.first_nonfinite_module
    assert hit is not None and hit.module == culprit and hit.op == "Linear"
    assert manual_culprit_parameter(setup.model, batch) == f"{culprit}.weight"
    assert report.deterministic
    assert math.isnan(report.first.loss)
    assert culprit in report.summary()


class InfGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * float("inf")


def test_a_gradient_fault_planted_in_a_known_parameter_is_named_in_the_backward() -> None:
    setup = make_setup()
    batch = setup.batch()
    layer = setup.model.blocks.layers[0].linear2
    layer.register_forward_hook(lambda module, inputs, output: InfGradient.apply(output))
    report = replay(setup.model, batch, lm_loss)
    run = report.first
    assert math.isfinite(run.loss), "the forward is healthy"
    assert run.first_nonfinite_module is None
    assert run.first_nonfinite_grad is not None
    assert run.first_nonfinite_grad.startswith("blocks.layers.0.linear2.")
    # manual search: gradients are finite downstream of the fault (closer to the loss) and
    # non-finite from the faulty layer on
    setup.model.zero_grad(set_to_none=True)
    lm_loss(setup.model, batch).backward()
    finite = {n: bool(torch.isfinite(p.grad).all()) for n, p in setup.model.named_parameters()}
    downstream = [n for n in finite if n.startswith(("blocks.layers.1.", "norm.", "head."))]
    assert downstream and all(finite[n] for n in downstream)
    assert not finite["blocks.layers.0.linear2.weight"]


class Flaky(nn.Module):
    """Like a faulty device: corrupts every other forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * float("nan") if self.calls % 2 else x


def test_a_transient_fault_is_told_from_a_deterministic_one() -> None:
    model = nn.Sequential(nn.Linear(4, 4), Flaky(), nn.Linear(4, 1))
    report = replay(model, torch.randn(3, 4), lambda m, b: m(b).mean(), runs=2)
    assert not report.deterministic
    assert "NOT deterministic" in report.summary()
    assert report.first.first_nonfinite_module.module == "1"


def test_replay_leaves_the_model_and_its_gradients_alone() -> None:
    setup = make_setup()
    batch = setup.batch()
    lm_loss(setup.model, batch).backward()
    grads = {n: p.grad.clone() for n, p in setup.model.named_parameters()}
    weights = copy.deepcopy(setup.model.state_dict())
    replay(setup.model, batch, lm_loss)
    for name, param in setup.model.named_parameters():
        assert torch.equal(param.grad, grads[name])
    for name, value in setup.model.state_dict().items():
        assert torch.equal(value, weights[name])


def test_corrupt_or_foreign_snapshots_get_a_clear_error(tmp_path) -> None:
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a snapshot at all" * 10)
    with pytest.raises(SnapshotError, match="not a readable trainguard snapshot"):
        trainguard.load_snapshot(garbage)
    foreign = tmp_path / "foreign.pt"
    torch.save({"model": {}, "epoch": 3}, foreign)
    with pytest.raises(SnapshotError, match="not a trainguard snapshot"):
        trainguard.load_snapshot(foreign)
    with pytest.raises(SnapshotError, match="no snapshot"):
        trainguard.load_snapshot(tmp_path / "missing.pt")


def test_the_guard_replays_a_bad_step_and_attaches_the_answer() -> None:
    setup = make_setup()
    guard = trainguard.Guard(setup.model, setup.optimizer,
                             config=trainguard.GuardConfig(sinks={"console": False}),
                             replay_fn=lm_loss)
    for _ in range(3):
        batch = setup.batch()
        lm_loss(setup.model, batch).backward()
        assert guard.step(lm_loss(setup.model, batch).detach(), batch=batch).events == []
        setup.optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        setup.model.blocks.layers[1].linear1.weight[0, 0] = float("nan")
    batch = setup.batch()
    loss = lm_loss(setup.model, batch)
    loss.backward()
    report = guard.step(loss, batch=batch)
    assert report.action == "skipped"
    replayed = next(e for e in report.events if e.kind == "nonfinite_loss").details["replay"]
    assert replayed["first_nonfinite_module"] == "blocks.layers.1.linear1"
    assert replayed["deterministic"] is True
