"""The RNG state each training forward starts from (`diagnose/step_rng.py`): kept before
training forwards only, handed over once, untouched by a proof's replays, and what lets a replay
draw the step's own dropout masks and give the loss the step had."""

from __future__ import annotations

import torch

from trainguard.diagnose.counterfactual import Setup, prove
from trainguard.diagnose.step_rng import StepRNG

from .test_counterfactual import mlp, mse, regression


def test_kept_before_each_training_forward_and_handed_over_once() -> None:
    model = mlp(dropout=0.3)
    kept = StepRNG(model)
    x = regression()["x"]
    before = torch.get_rng_state()
    model(x)
    state = kept.take()
    assert state is not None and torch.equal(state[0], before)
    assert kept.take() is None  # handed over once
    model.eval()
    model(x)
    assert kept.take() is None  # evaluation forwards are not steps
    model.train()
    model(x)
    with kept.kept():
        model(x)  # a replay inside a proof
    assert kept.take() is not None
    kept.close()
    model(x)
    assert kept.take() is None


def test_a_replay_from_the_steps_rng_gives_the_loss_the_step_had() -> None:
    """With dropout, the replay reproduces the step only from the RNG its forward started from:
    from the RNG as it stands after the step (its forward drew from it) the masks differ."""
    torch.manual_seed(0)
    model = mlp(dropout=0.3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = regression()
    kept = StepRNG(model)
    loss = mse(model, batch)  # the step as it ran
    loss.backward()
    state = kept.take()
    ran = float(loss)
    faithful = prove(Setup(model, opt, mse, batch, step=5, original_loss=ran,
                           original_finite=True, forward_rng=state))
    assert faithful.plain.loss == ran and faithful.faithful is True
    after = torch.get_rng_state()
    other = prove(Setup(model, opt, mse, batch, step=5, original_loss=ran,
                        original_finite=True))
    assert other.plain.loss != ran and other.faithful is False
    assert torch.equal(torch.get_rng_state(), after)  # the proof put the run's RNG back


def test_a_window_step_replays_from_its_own_rng() -> None:
    """A window replay's step gives the loss the run recorded for it when its forward's RNG was
    kept (with dropout 0.5 the masks decide the loss); from the RNG as it ran on, another."""
    from trainguard.diagnose.counterfactual import ReplayState, WindowStep, _window_step

    torch.manual_seed(0)
    model = mlp(dropout=0.5)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = regression()
    kept = StepRNG(model)
    ran = float(mse(model, batch))
    state = kept.take()
    torch.rand(10)  # the run went on drawing
    saved = ReplayState(model, opt)
    setup = Setup(model, opt, mse, batch)
    own = _window_step(setup, WindowStep(0, batch, (1e-3,), loss=ran, forward_rng=state), 1.0)
    saved.restore()
    other = _window_step(setup, WindowStep(0, batch, (1e-3,), loss=ran), 1.0)
    saved.restore()
    assert float(own) == ran and float(other) != ran
