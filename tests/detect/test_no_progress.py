"""`no_progress` and the verdict `stalled`: a run that trained long enough to tell and whose loss
never came down, against slow learners, plateaus after learning and long warm-ups."""

from __future__ import annotations

import math
import random

import pytest
import torch

import trainguard
from trainguard.config import DetectorConfig
from trainguard.detect.no_progress import NoProgress, came_down
from trainguard.signals import StepSignals
from trainguard.verdict import LossTrack


def feed(losses: list[float], *, grads: list[float] | None = None,
         lrs: list[float] | None = None, stall_steps: int = 100) -> list[str]:
    detector = NoProgress(DetectorConfig(no_progress={"steps": stall_steps}))
    messages = []
    for step, loss in enumerate(losses):
        signals = StepSignals(step=step, loss=loss,
                              grad_norm=grads[step] if grads else 1.0,
                              param_grad_norm=torch.zeros(0), param_names=[])
        signals.lr = lrs[step] if lrs else 1e-4
        messages += [e.message for e in detector.check(signals)]
    return messages


def noisy(values: list[float], sd: float, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [v + rng.gauss(0, sd) for v in values]


def test_a_flat_loss_after_enough_steps_is_a_stall() -> None:
    [message] = feed(noisy([4.7] * 150, 0.05))
    assert message.startswith("the loss has not come down in 100 steps")


def test_a_gradient_norm_that_collapsed_with_the_loss_flat_says_so() -> None:
    grads = [1.0] * 20 + [1.0 / 300] * 130
    [message] = feed(noisy([4.7] * 150, 0.02), grads=grads)
    assert "gradient norm fell 300x" in message and "LR far too high" in message


@pytest.mark.parametrize("losses", [
    noisy([2.0 - 0.001 * i for i in range(300)], 0.05),  # a slow learner: 15% in 300 steps
    noisy([3.0 * math.exp(-i / 10) + 1.0 for i in range(300)], 0.02),  # learned, then plateau
    [0.0] * 300,  # a loss of exactly 0: nothing left to learn
], ids=["slow-learner", "plateau-after-learning", "zero-loss"])
def test_learning_runs_are_not_stalls(losses: list[float]) -> None:
    assert feed(losses) == []


def test_steps_of_a_long_warmup_do_not_count() -> None:
    """200 warm-up steps from LR 0 with the loss flat, then the loss falls at the working LR."""
    lrs = [1e-4 * min(1.0, i / 200) for i in range(400)]
    losses = noisy([3.0] * 210 + [3.0 - 0.01 * i for i in range(190)], 0.02)
    assert feed(losses, lrs=lrs) == []


def test_steps_at_lr_0_count_and_the_stall_says_the_lr_was_0() -> None:
    """A run whose LR stays at 0 never trains: it is judged like any other."""
    [message] = feed(noisy([4.7] * 150, 0.05), lrs=[0.0] * 150)
    assert message.startswith("the loss has not come down in 100 steps")
    assert "the LR was 0 at every one of those 100 steps" in message


def test_a_first_group_at_lr_0_beside_one_that_trains_is_judged() -> None:
    """A backbone held at LR 0 in the first group, the head training in the second: the run's
    LR is the head's."""
    detector = NoProgress(DetectorConfig())
    messages = []
    for step, loss in enumerate(noisy([4.7] * 150, 0.05)):
        signals = StepSignals(step=step, loss=loss, grad_norm=1.0,
                              param_grad_norm=torch.zeros(0), param_names=[], lr=0.0,
                              group_lrs=(0.0, 1e-3))
        messages += [e.message for e in detector.check(signals)]
    assert len(messages) == 1 and "the LR was 0" not in messages[0]


def test_came_down_is_measured_against_the_starts_own_noise() -> None:
    start = [2.0 + 0.3 * (-1) ** i for i in range(20)]  # median 2.0, one sd about 0.44
    assert not came_down(start, [v - 0.1 for v in start]), "within the start's noise"
    assert came_down(start, [v - 0.8 for v in start])
    assert not came_down([2.0] * 20, [1.99] * 20), "a noiseless start: 2% of it at least"


# -- the verdict ----------------------------------------------------------------------------------
def verdict(losses: list[float], trouble_at: int | None = None) -> str:
    track = LossTrack()
    for step, loss in enumerate(losses):
        track.observe(step, loss, trouble=step == trouble_at)
    result = track.verdict()
    assert result is not None
    return result.verdict


def test_a_run_that_never_learned_is_stalled_even_after_trouble() -> None:
    """The loss flat at 4.70 with a gradient explosion on the way: not `recovered`."""
    assert verdict(noisy([4.7] * 150, 0.02), trouble_at=80) == "stalled"
    assert verdict(noisy([4.7] * 150, 0.02)) == "stalled"


def test_a_short_run_is_not_judged_stalled() -> None:
    assert verdict(noisy([4.7] * 60, 0.02)) == "healthy"


def test_after_trouble_the_end_is_judged_against_the_runs_best() -> None:
    """Down from 3.0 to 1.0, trouble, then back up to 1.6 and staying: 1.6 is no worse than the
    2.0 the loss had when the trouble came, yet far from the best the run had reached."""
    losses = noisy([3.0 - 0.02 * i for i in range(100)] + [1.0] * 50 + [1.6] * 60, 0.01)
    assert verdict(losses, trouble_at=90) == "degraded"


@pytest.mark.parametrize("losses", [
    noisy([2.0 - 0.001 * i for i in range(300)], 0.05),
    noisy([3.0 * math.exp(-i / 10) + 1.0 for i in range(300)], 0.02),
], ids=["slow-learner", "plateau-after-learning"])
def test_healthy_learners_are_healthy(losses: list[float]) -> None:
    assert verdict(losses) == "healthy"


def test_the_stall_state_survives_a_checkpoint() -> None:
    track = LossTrack()
    for step, loss in enumerate(noisy([4.7] * 120, 0.02)):
        track.observe(step, loss, trouble=False)
    copy = LossTrack()
    copy.load_state_dict(track.state_dict())
    assert copy.verdict() == track.verdict()
    detector, restored = NoProgress(DetectorConfig()), NoProgress(DetectorConfig())
    for step in range(30):
        detector.check(StepSignals(step=step, loss=4.7, grad_norm=1.0,
                                   param_grad_norm=torch.zeros(0), param_names=[]))
    restored.load_state_dict(detector.state_dict())
    assert restored.state_dict() == detector.state_dict()


# -- as a user meets it: a real model ------------------------------------------------------------
def _markov_batches(count: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(count):
        ids = (torch.randint(0, 100, (8, 1), generator=generator) + torch.arange(32)) % 100
        out.append({"input_ids": ids, "labels": ids})
    return out


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100,
                                      n_positions=32))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_lora_at_lr_0_5_is_stalled_with_the_lr_first(tmp_path) -> None:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_gpt2(), LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.5)
    guard = trainguard.Guard(model, optimizer, run_dir=tmp_path / "run",
                             config=trainguard.GuardConfig(sinks={"console": False}))
    for batch in _markov_batches(150):
        loss = model(**batch).loss
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    assert guard.verdict is not None and guard.verdict.verdict == "stalled"
    assert guard.diagnose()[0].code == "lr_too_high"


@pytest.mark.slow
def test_a_loss_computed_under_no_grad_is_stalled_with_no_gradients_first(tmp_path) -> None:
    model = _gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = trainguard.Guard(model, optimizer, run_dir=tmp_path / "run",
                             config=trainguard.GuardConfig(sinks={"console": False}))
    for batch in _markov_batches(120):
        with torch.no_grad():
            loss = model(**batch).loss
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    assert guard.verdict is not None and guard.verdict.verdict == "stalled"
    assert guard.diagnose()[0].code == "no_gradients"
    assert "no_progress" in {e.kind for e in guard.events}


def test_a_loss_at_its_noise_floor_from_the_first_steps_is_not_a_stall() -> None:
    """Heavy-tailed targets (Student-t, 3 degrees of freedom): the model reaches the floor in a
    few steps and the loss is then its data's noise (a spread of a third of its level); a stall
    cannot be told from that, so none is claimed."""
    rng = random.Random(5)
    losses = [5.0, 3.5] + [3.0 * (1 + 0.5 * rng.gauss(0, 1)) ** 2 / 1.25 for _ in range(298)]
    assert feed(losses) == []
    assert verdict(losses) != "stalled"
