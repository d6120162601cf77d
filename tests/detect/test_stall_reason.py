"""A stall names what the run shows: the LR at 0, updates too small to move the weights, weights
frozen, or a loss at chance while the weights move (labels that carry no signal). On real small
runs as a user meets them, and on the evidence alone."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch
from torch import nn

from trainguard import Guard, GuardConfig
from trainguard.config import DetectorConfig
from trainguard.detect.no_progress import NoProgress
from trainguard.detect.stall_reason import StallEvidence
from trainguard.signals import SampledStats, StepSignals

from ..conftest import make_setup

QUIET = GuardConfig(sinks={"console": False})


def stalls(guard: Guard) -> list:
    return [e for e in guard.events if e.kind == "no_progress"]


def train_lm(lr: float, steps: int = 130, *, zero_schedule: bool = False,
             trainable: str | None = None) -> Guard:
    """TinyCausalLM on its Markov language, AdamW without warmup; `zero_schedule`: a scheduler
    that leaves the LR at 0; `trainable`: only the parameters whose names start so train."""
    setup = make_setup(lr=lr, warmup=0, total=steps)
    if trainable is not None:
        for name, param in setup.model.named_parameters():
            param.requires_grad_(name.startswith(trainable))
    scheduler = (torch.optim.lr_scheduler.LambdaLR(setup.optimizer, lambda step: 0.0)
                 if zero_schedule else None)
    guard = Guard(setup.model, setup.optimizer, scheduler, config=QUIET)
    for _ in range(steps):
        batch = setup.batch()
        loss = setup.model.loss(batch)
        loss.backward()
        guard.step(loss, batch=batch)
        setup.optimizer.zero_grad(set_to_none=True)
    guard.close()
    return guard


def train_classifier(optimizer: str, *, random_labels: bool, steps: int = 130,
                     schedule: str | None = None, clip: float | None = None,
                     weight_decay: float = 0.0) -> Guard:
    """A ReLU MLP on 4 classes, a fresh batch of Gaussian inputs each step; the labels drawn
    apart from the inputs (`random_labels`) or read from them (the argmax of a fixed
    projection). The new head starts small, as heads are initialised (its first loss is at
    chance). `clip`: the loop clips the gradients to this norm before `Guard.step`."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    nn.init.normal_(model[2].weight, std=0.01)
    nn.init.zeros_(model[2].bias)
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-3) if optimizer == "adamw"
           else torch.optim.SGD(model.parameters(), lr=0.05, weight_decay=weight_decay))
    scheduler = {
        None: None,
        # written for epochs of 10 batches, stepped every batch
        "step_per_batch": lambda: torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.1),
        "warm_restarts": lambda: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, 100),
    }[schedule]
    guard = Guard(model, opt, scheduler() if scheduler else None, config=QUIET)
    generator = torch.Generator().manual_seed(1)
    projection = torch.randn(16, 4, generator=generator)
    for _ in range(steps):
        x = torch.randn(32, 16, generator=generator)
        y = (torch.randint(0, 4, (32,), generator=generator) if random_labels
             else (x @ projection).argmax(1))
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        guard.step(loss, batch={"x": x, "labels": y})
        opt.zero_grad(set_to_none=True)
    guard.close()
    return guard


# -- as a user meets it: real small runs ------------------------------------------------------
@pytest.mark.parametrize("zero_schedule", [False, True], ids=["lr=0.0", "scheduler-at-0"])
def test_a_run_at_lr_0_stalls_and_says_the_lr_was_0(zero_schedule: bool) -> None:
    guard = train_lm(0.0 if not zero_schedule else 3e-3, zero_schedule=zero_schedule)
    event, = stalls(guard)
    assert event.severity == "warning" and event.details["cause"] == "lr_too_low"
    assert "the LR was 0 at every one of those 100 steps, in every parameter group" in (
        event.message)
    assert guard.verdict is not None and guard.verdict.verdict == "stalled"
    assert guard.verdict.message.endswith("the run did not learn; " + event.details["reason"])
    assert guard.diagnose()[0].code == "lr_too_low"


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_labels_drawn_apart_from_the_inputs_stall_at_chance_and_are_named(optimizer: str) -> None:
    guard = train_classifier(optimizer, random_labels=True)
    event, = stalls(guard)
    assert event.details["cause"] == "label_problem"
    assert event.details["classes"] == 4
    assert "the loss sits at chance level, ln 4 = 1.386" in event.message
    assert "while the weights move" in event.message and "the gradients flow" in event.message
    top = guard.diagnose()[0]
    assert top.code == "label_problem" and top.confidence > 0.5
    # the same model, labels read from the inputs: it learns, nothing is said
    learning = train_classifier(optimizer, random_labels=False)
    assert learning.events == []
    assert learning.verdict is not None and learning.verdict.verdict == "healthy"


def test_an_lr_that_fell_1000x_within_the_steps_judged_is_named() -> None:
    guard = train_classifier("adamw", random_labels=True, schedule="step_per_batch")
    event, = stalls(guard)
    assert event.details["cause"] == "lr_too_low"
    assert "the LR fell to 1e-13 by the last of those steps" in event.message
    assert guard.diagnose()[0].code == "lr_too_low"


def test_the_end_of_a_cosine_cycle_is_no_fallen_lr() -> None:
    """Judged as a cosine cycle ends: its last two steps are under 1/1000 of the top, which
    says nothing of the 98 before them; the labels are what the run shows."""
    guard = train_classifier("adamw", random_labels=True, schedule="warm_restarts")
    event, = stalls(guard)
    assert event.details["cause"] == "label_problem"


def test_an_lr_too_low_to_move_the_weights_is_named() -> None:
    guard = train_lm(1e-7)
    event, = stalls(guard)
    assert event.details["cause"] == "lr_too_low"
    assert 0 < event.details["update"] < 1e-4
    assert "at LR 1e-07 the weights barely move" in event.message
    assert guard.diagnose()[0].code == "lr_too_low"


@pytest.mark.parametrize("max_norm", [1e-2, 1e-4])
def test_a_loop_that_clips_every_step_to_a_tiny_norm_names_its_clip(max_norm: float) -> None:
    """SGD whose loop clips to a max_norm far under the gradients' norm: every update is scaled
    down, the loss stays at chance. Not the labels, not the LR: the clip."""
    guard = train_classifier("sgd", random_labels=False, clip=max_norm)
    event, = stalls(guard)
    assert event.details["cause"] == "clip_too_tight"
    assert event.details["grad_norm"] == pytest.approx(max_norm, rel=1e-3)
    assert f"the gradient norm was {max_norm:.3g} at" in event.message
    assert guard.diagnose()[0].code == "clip_too_tight"


def test_a_clip_every_step_under_adam_is_no_reason() -> None:
    """Adam divides the clip's scale out: its updates keep their size, the run learns."""
    guard = train_classifier("adamw", random_labels=False, clip=1e-2)
    assert not stalls(guard)


def test_a_clip_that_leaves_the_updates_their_size_is_not_why_labels_stall() -> None:
    """Labels drawn apart from the inputs under a loop clip of 1.0 that every step reaches:
    the weights move, the loss sits at chance, the labels are named."""
    guard = train_classifier("sgd", random_labels=True, clip=1e-1)
    event, = stalls(guard)
    assert event.details["cause"] == "label_problem"


def test_a_pinned_norm_is_counted_in_a_row_and_kept_across_a_resume() -> None:
    evidence = StallEvidence()
    for norm in (0.5, 0.01, 0.0100001, 0.01, float("nan"), 0.01):
        evidence.see(StepSignals(step=0, loss=1.0, grad_norm=norm,
                                 param_grad_norm=np.ones(2), param_names=["a", "b"]), 0.1)
    assert (evidence.pin, evidence.pinned) == (0.01, 1)  # the NaN broke the row
    restored = StallEvidence()
    restored.load_state_dict(json.loads(json.dumps(evidence.state_dict())))
    assert (restored.pin, restored.pinned) == (0.01, 1)


def test_a_weight_decay_that_takes_the_weights_names_itself_not_the_labels() -> None:
    """SGD 0.05 with weight_decay 0.5 (2.5% of every weight a step): the loss stays near
    chance while the weights "move"; the movement is the decay's, and the preflight found it."""
    guard = train_classifier("sgd", random_labels=False, weight_decay=0.5)
    event, = stalls(guard)
    assert event.details["cause"] == "weight_decay_too_high"
    assert event.details["decay_per_step"] == pytest.approx(0.025)
    assert "the weight decay takes 2.50% of every weight's norm a step" in event.message
    assert guard.diagnose()[0].code == "weight_decay_too_high"


def test_a_usual_weight_decay_leaves_the_labels_named() -> None:
    """Labels drawn apart from the inputs under SGD's usual weight_decay (5e-4): the preflight
    says nothing of it and the stall is the labels'."""
    guard = train_classifier("sgd", random_labels=True, weight_decay=5e-4)
    event, = stalls(guard)
    assert event.details["cause"] == "label_problem"
    assert not [f for f in guard.findings if f.check == "weight_decay"]


def test_a_model_frozen_but_for_its_final_norm_names_the_frozen_weights() -> None:
    """Every parameter frozen but the final LayerNorm, the optimizer built over all of them:
    the few weights that train cannot move the loss."""
    guard = train_lm(3e-3, trainable="norm.")
    event, = stalls(guard)
    assert event.details["cause"] == "no_gradients"
    assert event.details["trained_share"] < 0.01
    assert "27 of the 29 watched parameters got none" in event.message
    assert "(frozen, or not reached by the loss): tok.weight, pos.weight" in event.message


# -- the evidence alone -----------------------------------------------------------------------
NAMES = ["body.weight", "head.weight"]


def step(i: int, loss: float, *, lrs: tuple[float, ...] = (1e-3,), grads: tuple | None = None,
         update: tuple | None = None, classes: int | None = None) -> StepSignals:
    """One step's signals; `grads`: its parameters' gradient norms (by default a batch's noise
    around 1, so that the norm is not one value at every step, as a loop's clip leaves it)."""
    grads = grads if grads is not None else (1.0 + 0.05 * math.sin(i), 1.0)
    signals = StepSignals(step=i, loss=loss, grad_norm=float(np.hypot(*grads)),
                          param_grad_norm=np.asarray(grads, dtype=np.float32),
                          param_names=list(NAMES), lr=lrs[0], group_lrs=lrs)
    if update is not None:
        output = {"out_classes": float(classes)} if classes else {}
        signals.sampled = [SampledStats(step=i - 1, per_param={
            "update_ratio": np.asarray(update, dtype=np.float32)}, output=output)]
    return signals


def judge(losses: list[float], **kwargs) -> list:
    """`losses` through `no_progress`, with an update measured every 25 steps."""
    detector = NoProgress(DetectorConfig())
    update = kwargs.pop("update", (0.01, 0.01))
    events = []
    for i, loss in enumerate(losses):
        events += detector.check(step(i, loss, update=update if i % 25 == 1 else None,
                                      **kwargs))
    return events


def flat(level: float, n: int = 150, sd: float = 0.005, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [level + rng.gauss(0, sd) for _ in range(n)]


def test_the_groups_at_lr_0_of_weights_that_take_no_update_are_named() -> None:
    """The weights with gradients sit in a group at LR 0 beside one that trains nothing."""
    event, = judge(flat(2.0), lrs=(0.0, 1e-3), update=(0.0, 0.0))
    assert event.details["cause"] == "lr_too_low"
    assert "took no update at any of the" in event.message
    assert "1 of the 2 parameter groups are at LR 0" in event.message


def test_a_loss_at_chance_that_falls_steadily_is_not_the_labels() -> None:
    """At chance, and falling by 1% over the steps judged under updates of 0.5% of the weights
    a step: coming down, slowly, is no sign of labels without signal, and steps of that size
    are what holds it back."""
    chance = math.log(4)
    losses = [v * (1 - 0.0001 * i) for i, v in enumerate(flat(chance, sd=0.002))]
    event, = judge(losses, classes=4, update=(0.005, 0.005))
    assert event.details["cause"] == "lr_too_low"
    assert "the loss falls steadily, but slowly (its trend" in event.message
    assert "the updates move the typical weight by 0.005 of its norm per step" in event.message


def test_a_steady_fall_under_large_updates_names_no_cause() -> None:
    """The same fall under updates of 3% of the weights a step: the steps are not small, and
    an LR too high may be what keeps the fall slow."""
    chance = math.log(4)
    losses = [v * (1 - 0.0001 * i) for i, v in enumerate(flat(chance, sd=0.002))]
    event, = judge(losses, classes=4, update=(0.03, 0.03))
    assert "cause" not in event.details
    assert "the loss falls steadily, but slowly" in event.message


def test_a_stall_below_chance_with_moving_weights_names_no_cause() -> None:
    event, = judge(flat(1.0), classes=4)
    assert "cause" not in event.details
    assert event.message.endswith("the weights move (0.01 of their norm per step), the "
                                  "gradients flow and the loss is below chance level "
                                  "(ln 4 = 1.386); no cause shows (the LR may be too high or "
                                  "too low for this model)")


def test_a_loss_at_chance_with_weights_that_barely_move_is_the_lr() -> None:
    event, = judge(flat(math.log(4)), classes=4, update=(1e-6, 1e-6))
    assert event.details["cause"] == "lr_too_low"


def test_a_norm_pinned_by_the_loops_clip_with_weights_that_barely_move_is_the_clip() -> None:
    event, = judge(flat(math.log(4)), classes=4, update=(1e-4, 1e-4), grads=(0.006, 0.008))
    assert event.details["cause"] == "clip_too_tight"
    assert event.details["grad_norm"] == pytest.approx(0.01)


def test_a_pinned_norm_with_updates_of_a_healthy_size_is_no_reason() -> None:
    """Every step clipped to 1.0 (a fine-tune whose norms are all above it) while the weights
    move 1% a step: the clip leaves the updates their size; the stall is the labels'."""
    event, = judge(flat(math.log(4)), classes=4, grads=(0.6, 0.8))
    assert event.details["cause"] == "label_problem"


def test_a_decay_that_moves_the_weights_as_much_as_they_moved_is_the_reason() -> None:
    """The preflight's decay (1% a step) against updates of 1% a step: the decay's; against
    updates of 5% a step, the gradients move the weights and the decay is not why."""
    for update, cause in ((0.01, "weight_decay_too_high"), (0.05, "label_problem")):
        detector = NoProgress(DetectorConfig())
        detector.decay = 0.01
        events = []
        for i, loss in enumerate(flat(math.log(4))):
            events += detector.check(step(i, loss, update=(update, update) if i % 25 == 1
                                          else None, classes=4))
        event, = events
        assert event.details["cause"] == cause
        restored = NoProgress(DetectorConfig())
        restored.load_state_dict(json.loads(json.dumps(detector.state_dict())))
        assert restored.decay == 0.01


def test_the_evidence_survives_a_checkpoint() -> None:
    evidence = StallEvidence()
    for i in range(30):
        evidence.see(step(i, 2.0, update=(0.01, 0.0) if i % 10 == 1 else None, classes=3,
                          grads=(1.0, 0.0)), 1e-3)
    copy = StallEvidence()
    copy.load_state_dict(json.loads(json.dumps(evidence.state_dict())))
    assert copy.state_dict() == evidence.state_dict()
    args = ([2.0] * 20, NAMES, (1e-3,), 0.0)
    assert copy.explain(*args) == evidence.explain(*args)
