"""A ReLU MLP classifier: layers that die, predictions that collapse, labels that go wrong.

Model: 16 -> 64 -> 64 -> 4, ReLU, trained from scratch with plain SGD (0.05, batch 64, 300 steps)
on four Gaussian blobs; evaluated every 25 steps on held-out blobs (accuracy and loss, handed to
trainguard with `observe_eval`, as a training loop that evaluates does). A healthy run ends near
100% accuracy with about half of its hidden activations at zero at any one time, as ReLU layers
do.

Scenarios:
    mlp_cls_healthy      the healthy run.
    mlp_cls_dead_relu    (§2.2) a schedule glitch gives steps 80 and 81 an LR of 300: the second
                         hidden layer's units are pushed below zero for every input and stay
                         there (their gradient is zero too); the model predicts one class for
                         every input and its loss sits at ln 4 for the rest of the run. The fix
                         is the architecture's as much as the LR's: LeakyReLU or GELU units do
                         not die this way.
    mlp_cls_label_shift  (§3.2) from step 120 a new data shard maps its labels wrongly (class i is
                         labelled i + 1): the train loss jumps, then falls again as the model
                         learns the wrong mapping, while the held-out accuracy (correct labels)
                         drops far below chance.
    mlp_cls_double_softmax (§3.3.1) the model ends in `nn.Softmax` and `cross_entropy` applies its
                         own: the loss sees probabilities in [0, 1], cannot fall below
                         ln(1 + 3/e) = 0.74, and its gradients shrink as the model grows sure.
    mlp_cls_nll_on_logits (§3.3.1) the loop hands the model's raw scores to `nll_loss`, which
                         takes log-probabilities: its loss is -z[y], falls without bound as
                         the scores grow, and says nothing of what is learned.
    mlp_cls_eval_mode    (§3.4) a model with dropout (0.1 after each hidden layer) whose
                         evaluation calls model.eval() and never model.train(): from the first
                         evaluation (after step 24) it trains with its dropout off.
    mlp_cls_clip_too_tight (§2.1) the loop clips the gradients itself, with
                         `clip_grad_norm_(model.parameters(), 0.001)`, under every step's norm:
                         each SGD update is a few hundredths of its size and the model stays
                         near chance for the whole run.
    mlp_cls_weight_decay (§3.1) SGD built with weight_decay=0.5 (a setting a hundred to a
                         thousand times the usual): 2.5% of every weight decays each step and
                         the weights stay small: unguarded, the held-out loss ends at 0.64 on
                         seed 0 against the healthy run's 0.0024.
    mlp_cls_schedule_per_batch (§3.1) a StepLR written for epochs (step_size=15, gamma=0.1)
                         stepped after every batch: the LR is a tenth of itself every 15 steps,
                         under 1e-4 of it from step 60, and the model stops learning there:
                         unguarded, the held-out loss ends at 0.41 on seed 0 against the
                         healthy run's 0.0024.
    mlp_cls_detached_layer (§3.4) the forward detaches the first hidden layer's output (a stray
                         `.detach()`): the first layer never gets a gradient and stays as
                         initialised while the layers after it learn around it: unguarded,
                         the held-out loss ends at 0.0065 on seed 0 against 0.0024.
    mlp_cls_unshuffled   (§3.2) the loader is built without shuffling over data stored class by
                         class: 4760 samples of class 0 (74 batches and a half), then of class
                         1, and so on, an epoch of 300 steps. The model predicts the class of
                         the moment and its loss jumps at every change of class: unguarded, its
                         held-out loss ends at 0.21-0.78 on seeds 0-2, the shuffled run's at
                         0.002.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import nn
from torch.nn import functional as F

from ..base import Scenario, Workload

FAMILY = "mlp_cls"
STEPS = 300
BATCH_SIZE = 64
LR = 0.05
CLASSES = 4
EVAL_EVERY = 25
GLITCH_STEPS = (80, 81)
GLITCH_LR = 300.0
LABEL_SHIFT_AT = 120
DROPOUT = 0.1
LOOP_CLIP = 1e-3
"""The max_norm of the loop's own clip in `mlp_cls_clip_too_tight`."""
HEAVY_DECAY = 0.5
"""SGD's weight_decay in `mlp_cls_weight_decay`: lr x weight_decay = 2.5% of every weight a
step."""
SCHEDULE_STEP = 15
"""`mlp_cls_schedule_per_batch`'s StepLR step_size, counted in the batches it is stepped on."""
SAMPLES_PER_CLASS = 4760
"""Samples of each class in a row when the data is not shuffled (74 batches and some: the batch
at each change of class holds two)."""


def _generator(seed: int, stream: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(((seed * 7919 + stream) * 1_000_003 + step) * 101)


@dataclass(frozen=True)
class Recipe:
    glitch: bool = False
    label_shift_at: int | None = None
    unshuffled: bool = False
    double_softmax: bool = False
    nll_on_logits: bool = False
    """The loss is `nll_loss` on the raw scores (no `log_softmax`)."""
    eval_mode_left: bool = False
    """The model has dropout, and its evaluation leaves it in eval mode."""
    loop_clip: float | None = None
    """The loop clips the gradients to this norm before the step."""
    weight_decay: float = 0.0
    """SGD's weight_decay."""
    schedule_per_batch: bool = False
    """A StepLR written for epochs, stepped after every batch."""
    detached: bool = False
    """The forward detaches the first hidden layer's output."""


class _Detached(nn.Module):
    """What a stray `.detach()` in a forward does, as a layer of the `nn.Sequential`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach()


def build(seed: int, recipe: Recipe) -> Workload:
    centers = torch.randn(CLASSES, 16, generator=_generator(0, 9, 0)) * 2
    torch.manual_seed(seed)
    def dropout() -> list[nn.Module]:
        return [nn.Dropout(DROPOUT)] if recipe.eval_mode_left else []

    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), *dropout(),
                          *([_Detached()] if recipe.detached else []), nn.Linear(64, 64),
                          nn.ReLU(), *dropout(), nn.Linear(64, CLASSES),
                          *([nn.Softmax(dim=1)] if recipe.double_softmax else []))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, weight_decay=recipe.weight_decay)

    def sample(generator: torch.Generator, size: int, labels: torch.Tensor | None = None
               ) -> dict[str, torch.Tensor]:
        y = torch.randint(0, CLASSES, (size,), generator=generator) if labels is None else labels
        return {"x": centers[y] + torch.randn(size, 16, generator=generator), "y": y}

    held_out = sample(_generator(seed, 1, 0), 512)

    def batch(step: int, micro: int) -> dict[str, torch.Tensor]:
        stored = ((step * BATCH_SIZE + torch.arange(BATCH_SIZE)) // SAMPLES_PER_CLASS) % CLASSES
        data = sample(_generator(seed, 0, step), BATCH_SIZE,
                      stored if recipe.unshuffled else None)
        if recipe.label_shift_at is not None and step >= recipe.label_shift_at:
            data = {"x": data["x"], "y": (data["y"] + 1) % CLASSES}
        return data

    def loss(model: nn.Module, data: dict[str, torch.Tensor], step: int) -> torch.Tensor:
        if recipe.nll_on_logits:
            return F.nll_loss(model(data["x"]), data["y"])
        return F.cross_entropy(model(data["x"]), data["y"])

    def before_step(step: int) -> None:
        optimizer.param_groups[0]["lr"] = GLITCH_LR if step in GLITCH_STEPS else LR

    def metrics(model: nn.Module) -> dict[str, float]:
        was_training = model.training
        model.eval()
        with torch.no_grad():
            logits = model(held_out["x"])
            accuracy = (logits.argmax(1) == held_out["y"]).float().mean()
            value = F.cross_entropy(logits, held_out["y"])
        if not recipe.eval_mode_left:  # the fault: the loop never switches it back
            model.train(was_training)
        return {"eval_accuracy": float(accuracy), "eval_loss": float(value)}

    def clip(step: int) -> None:
        assert recipe.loop_clip is not None
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.loop_clip)

    scheduler = (torch.optim.lr_scheduler.StepLR(optimizer, SCHEDULE_STEP, gamma=0.1)
                 if recipe.schedule_per_batch else None)
    return Workload(model=model, optimizer=optimizer, batch=batch, loss=loss,
                    scheduler=scheduler,
                    after_backward=clip if recipe.loop_clip is not None else None,
                    evaluate=lambda m: metrics(m)["eval_loss"], batch_size=BATCH_SIZE,
                    before_step=before_step if recipe.glitch else None,
                    eval_every=EVAL_EVERY, eval_metrics=metrics)


BASELINES: dict[str, str] = {"mlp_cls_clip_too_tight": "mlp_cls_healthy",
                             "mlp_cls_dead_relu": "mlp_cls_healthy",
                             "mlp_cls_double_softmax": "mlp_cls_healthy",
                             "mlp_cls_eval_mode": "mlp_cls_healthy",
                             "mlp_cls_nll_on_logits": "mlp_cls_healthy",
                             "mlp_cls_label_shift": "mlp_cls_healthy",
                             "mlp_cls_unshuffled": "mlp_cls_healthy",
                             "mlp_cls_schedule_per_batch": "mlp_cls_healthy",
                             "mlp_cls_detached_layer": "mlp_cls_healthy",
                             "mlp_cls_weight_decay": "mlp_cls_healthy"}


def scenarios() -> list[Scenario]:
    return [
        Scenario("mlp_cls_healthy", FAMILY, partial(build, recipe=Recipe()), STEPS,
                 description=f"ReLU MLP on {CLASSES} blobs, SGD {LR:g}, evaluated every "
                             f"{EVAL_EVERY} steps"),
        Scenario("mlp_cls_dead_relu", FAMILY, partial(build, recipe=Recipe(glitch=True)), STEPS,
                 cause="dead_units", onset_step=GLITCH_STEPS[0], sudden=True, recoverable=False,
                 description=f"a schedule glitch: LR {GLITCH_LR:g} at steps {GLITCH_STEPS}; the "
                             "second hidden layer dies and every input gets one class"),
        Scenario("mlp_cls_label_shift", FAMILY,
                 partial(build, recipe=Recipe(label_shift_at=LABEL_SHIFT_AT)), STEPS,
                 cause="label_problem", onset_step=LABEL_SHIFT_AT, sudden=False,
                 recoverable=False,
                 description=f"from step {LABEL_SHIFT_AT} the training labels are shifted by "
                             "one class; held-out accuracy falls below chance"),
        Scenario("mlp_cls_double_softmax", FAMILY,
                 partial(build, recipe=Recipe(double_softmax=True)), STEPS,
                 cause="double_activation", onset_step=0, sudden=False, recoverable=False,
                 description="the model ends in nn.Softmax and cross_entropy applies its own: "
                             "the loss sees probabilities, and learns ever more slowly"),
        Scenario("mlp_cls_nll_on_logits", FAMILY,
                 partial(build, recipe=Recipe(nll_on_logits=True)), STEPS, cause="nll_input",
                 onset_step=0, sudden=False, recoverable=False,
                 description="nll_loss on the raw scores (no log_softmax): the loss is -z[y] "
                             "and falls without bound"),
        Scenario("mlp_cls_eval_mode", FAMILY, partial(build, recipe=Recipe(eval_mode_left=True)),
                 STEPS, cause="model_in_eval_mode", onset_step=EVAL_EVERY, sudden=True,
                 recoverable=False,
                 description=f"dropout {DROPOUT:g} after each hidden layer; the evaluation "
                             "calls model.eval() and never model.train(): from the first one "
                             "on, the model trains with its dropout off"),
        Scenario("mlp_cls_clip_too_tight", FAMILY,
                 partial(build, recipe=Recipe(loop_clip=LOOP_CLIP)), STEPS,
                 cause="clip_too_tight", onset_step=0, sudden=False, recoverable=False,
                 description=f"the loop clips the gradients to max_norm {LOOP_CLIP:g} before "
                             "the step: every update is scaled down and the model stays near "
                             "chance"),
        Scenario("mlp_cls_weight_decay", FAMILY,
                 partial(build, recipe=Recipe(weight_decay=HEAVY_DECAY)), STEPS,
                 cause="weight_decay_too_high", onset_step=0, sudden=False, recoverable=False,
                 description=f"SGD with weight_decay {HEAVY_DECAY:g}: every weight decays "
                             f"{LR * HEAVY_DECAY:.1%} a step, and the model learns a fraction "
                             "of what it can"),
        Scenario("mlp_cls_schedule_per_batch", FAMILY,
                 partial(build, recipe=Recipe(schedule_per_batch=True)), STEPS,
                 cause="lr_at_zero", onset_step=0, sudden=False, recoverable=False,
                 description=f"a StepLR(step_size={SCHEDULE_STEP}, gamma=0.1) written for "
                             "epochs and stepped after every batch: the LR falls four decades "
                             "in 60 steps and the model stops learning"),
        Scenario("mlp_cls_detached_layer", FAMILY, partial(build, recipe=Recipe(detached=True)),
                 STEPS, cause="no_gradients", onset_step=0, sudden=False, recoverable=False,
                 description="the forward detaches the first hidden layer's output: the first "
                             "layer never gets a gradient, and the layers after it learn "
                             "around it"),
        Scenario("mlp_cls_unshuffled", FAMILY, partial(build, recipe=Recipe(unshuffled=True)),
                 STEPS, cause="unshuffled_data", onset_step=0, sudden=False, recoverable=False,
                 description=f"the data is not shuffled: {SAMPLES_PER_CLASS} samples of one "
                             "class, then the next; the model predicts the class of the moment"),
    ]
