"""Regression with heavy-tailed targets: healthy runs whose loss is spiky by nature.

Model: an MLP (16 -> 64 -> 64 -> 1, ReLU) fitting a fixed random linear-plus-sine function of
its inputs; the targets carry Student-t noise with 3 degrees of freedom, so a batch now and then
holds a sample many standard deviations out and its MSE jumps several-fold for one step. Adam
at 1e-3, batch 32, 300 steps, no schedule: a small model trained from scratch, as in many
tabular and scientific fits. A detector that judges jumps by a fixed ratio alone alarms on such
runs; trainguard must stay quiet on them and still find a real outlier batch.

Scenarios:
    regression_healthy_student_t   the heavy-tailed healthy run.
    regression_absorbed_outlier    the same run where one target of the batch of step 200 lies
                                   150 away from its fit (a label far out in the tail, a typo):
                                   the loss jumps some 200-300x and the gradient some 15-20x for
                                   that one step, and Adam's bounded update leaves the run as it
                                   was (a healthy run: the outlier is told, nothing more).
    regression_outlier_batch       the same run where one batch at step 200 comes from a source
                                   with inputs 1000x larger (a unit bug in one shard, §3.2).
    regression_input_scale_drift   (§3.2) from step 100 on, every batch comes from a source whose
                                   inputs are 1e4x larger (a pipeline that changed its units
                                   mid-run): the fault lasts, whatever the LR.
    regression_bad_shard           (§3.2) the 10 batches from step 100 come from one shard whose
                                   inputs are 1e4x larger, then the data are clean again.
    regression_target_broadcast    (§3.3.1) the loop hands `mse_loss` targets of shape (B,)
                                   against predictions of shape (B, 1): both are broadcast to
                                   (B, B), every prediction is scored against every target, and
                                   the model learns the batch mean whatever its input.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn
from torch.nn import functional as F

from ..base import Scenario, Workload

FAMILY = "regression"
STEPS = 300
BATCH_SIZE = 32
LR = 1e-3
DEGREES_OF_FREEDOM = 3.0
ONSET_STEP = 200
OUTLIER_SCALE = 1000.0
TARGET_OUTLIER = 150.0
"""How far the one far-out target of the absorbed outlier lies from its fit."""
DRIFT_STEP = 100
"""Onset of the lasting scale change and of the bad shard."""
DRIFT_SCALE = 1e4
SHARD_BATCHES = 10
EVAL_BATCHES = 8

_TRAIN_STREAM, _EVAL_STREAM, _TASK_STREAM = 0, 1, 2


def _generator(seed: int, stream: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(((seed * 7919 + stream) * 1_000_003 + step) * 101)


@dataclass(frozen=True)
class Recipe:
    outlier_at: int | None = None
    target_outlier_at: int | None = None
    """One target of this step's batch is TARGET_OUTLIER further out."""
    scaled_from: int | None = None
    """Batches from this step on have inputs DRIFT_SCALE times larger..."""
    scaled_batches: int | None = None
    """...for this many batches (None: to the end of the run)."""
    flat_targets: bool = False
    """The loss is handed the targets as a (B,) vector (a dataset of scalars), against the
    model's (B, 1) output."""


def build(seed: int, recipe: Recipe) -> Workload:
    task = _generator(0, _TASK_STREAM, 0)
    weights = torch.randn(16, 1, generator=task) / 4
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    def sample(generator: torch.Generator) -> dict[str, torch.Tensor]:
        x = torch.randn(BATCH_SIZE, 16, generator=generator)
        # Student-t noise from the batch's own generator: a normal over sqrt(chi2 / dof)
        dof = int(DEGREES_OF_FREEDOM)
        chi2 = (torch.randn(BATCH_SIZE, dof, generator=generator) ** 2).sum(1, keepdim=True)
        t_noise = torch.randn(BATCH_SIZE, 1, generator=generator) / torch.sqrt(chi2 / dof)
        y = x @ weights + torch.sin(x[:, :1] * 2) + t_noise
        return {"x": x, "y": y}

    held_out = [sample(_generator(seed, _EVAL_STREAM, i)) for i in range(EVAL_BATCHES)]

    def batch(step: int, micro: int) -> dict[str, torch.Tensor]:
        data = sample(_generator(seed, _TRAIN_STREAM, step))
        if step == recipe.outlier_at:
            data = {"x": data["x"] * OUTLIER_SCALE, "y": data["y"]}
        if step == recipe.target_outlier_at:
            y = data["y"].clone()
            y[0, 0] += TARGET_OUTLIER
            data = {"x": data["x"], "y": y}
        if _scaled(recipe, step):
            data = {"x": data["x"] * DRIFT_SCALE, "y": data["y"]}
        return data

    def loss(model: nn.Module, data: dict[str, torch.Tensor], step: int) -> torch.Tensor:
        target = data["y"].squeeze(-1) if recipe.flat_targets else data["y"]
        with warnings.catch_warnings():  # torch's own size warning: the loop does not see it
            warnings.simplefilter("ignore", UserWarning)
            return F.mse_loss(model(data["x"]), target)

    def evaluate(model: nn.Module) -> float:
        with torch.no_grad():
            # the median-robust held-out error: the MSE of heavy-tailed targets is dominated by
            # whichever noise sample is largest
            return float(torch.stack([(model(d["x"]) - d["y"]).abs().mean()
                                      for d in held_out]).mean())

    return Workload(model=model, optimizer=optimizer, batch=batch, loss=loss,
                    evaluate=evaluate, batch_size=BATCH_SIZE)


def _scaled(recipe: Recipe, step: int) -> bool:
    start = recipe.scaled_from
    if start is None or step < start:
        return False
    return recipe.scaled_batches is None or step < start + recipe.scaled_batches


BASELINES: dict[str, str] = {"regression_outlier_batch": "regression_healthy_student_t",
                             "regression_input_scale_drift": "regression_healthy_student_t",
                             "regression_bad_shard": "regression_healthy_student_t",
                             "regression_target_broadcast": "regression_healthy_student_t"}


def scenarios() -> list[Scenario]:
    return [
        Scenario("regression_healthy_student_t", FAMILY, partial(build, recipe=Recipe()), STEPS,
                 description=f"MLP regression, Student-t ({DEGREES_OF_FREEDOM:g} d.o.f.) target "
                             f"noise, Adam {LR:g}, batch {BATCH_SIZE}: spiky but healthy"),
        Scenario("regression_absorbed_outlier", FAMILY,
                 partial(build, recipe=Recipe(target_outlier_at=ONSET_STEP)), STEPS,
                 description=f"the heavy-tailed run with one target of the batch of step "
                             f"{ONSET_STEP} {TARGET_OUTLIER:g} away from its fit: a one-batch "
                             f"outlier the run absorbs"),
        Scenario("regression_outlier_batch", FAMILY,
                 partial(build, recipe=Recipe(outlier_at=ONSET_STEP)), STEPS,
                 cause="outlier_batch", onset_step=ONSET_STEP, sudden=True, recoverable=True,
                 description=f"the heavy-tailed run with one batch at step {ONSET_STEP} whose "
                             f"inputs are {OUTLIER_SCALE:g}x larger"),
        Scenario("regression_input_scale_drift", FAMILY,
                 partial(build, recipe=Recipe(scaled_from=DRIFT_STEP)), STEPS,
                 cause="input_scale", onset_step=DRIFT_STEP, sudden=True, recoverable=False,
                 description=f"from step {DRIFT_STEP} on every batch's inputs are "
                             f"{DRIFT_SCALE:g}x larger (the units changed mid-run)"),
        Scenario("regression_bad_shard", FAMILY,
                 partial(build, recipe=Recipe(scaled_from=DRIFT_STEP,
                                              scaled_batches=SHARD_BATCHES)), STEPS,
                 cause="outlier_batch", onset_step=DRIFT_STEP, sudden=True, recoverable=True,
                 description=f"the {SHARD_BATCHES} batches from step {DRIFT_STEP} come from a "
                             f"shard whose inputs are {DRIFT_SCALE:g}x larger"),
        Scenario("regression_target_broadcast", FAMILY,
                 partial(build, recipe=Recipe(flat_targets=True)), STEPS,
                 cause="loss_broadcast", onset_step=0, sudden=False, recoverable=False,
                 description="mse_loss of the (B, 1) predictions against (B,) targets: both "
                             "broadcast to (B, B), the model learns the batch mean"),
    ]
