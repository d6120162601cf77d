"""Image classification: fine-tuning a small pre-trained CNN on synthetic stripe images.

Model. `StripeCNN`: three conv blocks (3x3 conv, BatchNorm, ReLU; max-pooling after the first
two) on 3x16x16 images, global average pooling and a linear head. As is usual when fine-tuning a
pre-trained CNN with small batches, the BatchNorm statistics are frozen at their pre-trained values
(`FrozenStatsBatchNorm2d`, like detection models' FrozenBatchNorm); the affine parameters train.

Data. Coloured sinusoidal stripe patterns whose orientation and frequency depend on the class,
with a random phase, colour tint, background, contrast and pixel noise, in [0, 1]. The base model
is pre-trained briefly to tell four orientations apart (0, 45, 90, 135 degrees, any frequency);
fine-tuning puts a new head on it (std 0.02, the guide's advice for new layers) and learns a
related but different task: six classes, three orientations (15, 75, 135 degrees) times two
frequencies (coarse and fine). Held-out loss: cross-entropy on fixed clean batches.

Recipe. AdamW at the sane learning rate SANE_LR (warmup then cosine decay), batch 32.

Faults (cause codes from trainguard.diagnose.causes, with the guide's section):
- input_scale (3.2): the fine-tuning pipeline forgets the /255 of ToTensor and feeds images in
  [0, 255] to a model pre-trained on [0, 1]. With frozen BatchNorm statistics nothing rescales
  the activations, so the logits come out ~255x too large; the model spends the run adapting to
  the wrong scale and is useless on correctly normalised images.
- nonfinite_input (3.2): one image of the batch at `onset` carries a NaN (a corrupt file decoded
  into NaNs), or separately one pixel is +Inf (a division by zero in preprocessing). The loss and
  every gradient become NaN and one unprotected AdamW step writes NaN into all the weights.
  nan_burst: one image of each of 5 consecutive batches is NaN (a corrupt shard); the weights
  stay finite as long as those steps are skipped, so the state itself is never broken.
- outlier_batch (3.2): the batch at `onset` is 1000x (severe) or 100x (mild) its normal magnitude
  (raw sensor values not normalised). Its gradients are orders of magnitude above normal; the
  unprotected step throws the weights far off and Adam's second moment, inflated for thousands
  of steps, then all but stops learning. outlier_burst: 5 consecutive batches at 100x (a shard
  of raw sensor values).
- fp16_overflow (3.3.2): fine-tuning under float16 autocast with a GradScaler, from a base
  checkpoint whose intermediate activations are large: block 2's BatchNorm gain and shift are
  FP16_ACTIVATION_GAIN times larger and block 3's BatchNorm statistics compensate (as happens to a
  checkpoint trained in fp32/bf16, whose range hides activations that grew large). The function
  is the same in fp32 and bf16, but block 2's activations (~1e5) pass float16's 65504: the
  forward pass gives inf/NaN at every step, the GradScaler skips every step and collapses its loss
  scale, and the model never learns.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..base import Scenario, Workload, lm_eval
from ..pretrain import pretrained

FAMILY = "image_cls"
IMAGE_SIZE = 16
CHANNELS = 3

PRETRAIN_CLASSES = ((0.0, None), (45.0, None), (90.0, None), (135.0, None))
"""(orientation in degrees, cycles per image or None for any) of each pre-training class."""
FINETUNE_CLASSES = ((15.0, 1.7), (15.0, 3.5), (75.0, 1.7), (75.0, 3.5), (135.0, 1.7), (135.0, 3.5))

SANE_LR = 3e-3
"""AdamW peak learning rate at which this small CNN fine-tunes well (calibrated: held-out loss
0.45 at 1e-3, 0.16 at 3e-3, 0.09 at 1e-2, 0.12 at 3e-2; tiny models take larger rates than the
guide's 1e-6..5e-5 for 7B models)."""
STEPS = 200
WARMUP = 20
BATCH = 32
ONSET = 80
"""Step of the mid-run faults: the model has learned a good part of the task by then."""
BURST = 5
"""Consecutive poisoned batches in the outlier_burst scenario."""
FP16_ACTIVATION_GAIN = 2e4
"""How much larger block 2's activations are in the fp16_overflow base checkpoint."""


# -- data ----------------------------------------------------------------------------------------
def stripe_images(labels: torch.Tensor, classes: tuple[tuple[float, float | None], ...],
                  generator: torch.Generator, noise: float = 0.4) -> torch.Tensor:
    """Images (N, 3, 16, 16) in [0, 1] with stripes of each label's orientation and frequency."""
    n = labels.numel()

    def uniform(low: float, high: float, *shape: int) -> torch.Tensor:
        return low + (high - low) * torch.rand(*(shape or (n,)), generator=generator)

    angles = torch.tensor([c[0] for c in classes])[labels] + uniform(-12.0, 12.0)
    any_frequency = uniform(1.5, 4.0)
    fixed = torch.tensor([c[1] if c[1] is not None else math.nan for c in classes])[labels]
    cycles = torch.where(torch.isnan(fixed), any_frequency, fixed) * uniform(0.85, 1.15)
    phase = uniform(0.0, 2 * math.pi)
    coords = torch.arange(IMAGE_SIZE, dtype=torch.float32) / IMAGE_SIZE
    ys, xs = torch.meshgrid(coords, coords, indexing="ij")
    theta = torch.deg2rad(angles)[:, None, None]
    along = xs * torch.cos(theta) + ys * torch.sin(theta)
    wave = torch.sin(2 * math.pi * cycles[:, None, None] * along + phase[:, None, None])
    tint = uniform(0.4, 1.0, n, CHANNELS)[:, :, None, None]
    contrast = uniform(0.15, 0.35)[:, None, None, None]
    background = uniform(0.35, 0.65)[:, None, None, None]
    images = background + contrast * tint * wave[:, None]
    images = images + noise * torch.randn(images.shape, generator=generator)
    return images.clamp(0.0, 1.0)


def labelled_batch(classes: tuple[tuple[float, float | None], ...], size: int,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(len(classes), (size,), generator=generator)
    return stripe_images(labels, classes, generator), labels


# -- model ---------------------------------------------------------------------------------------
class FrozenStatsBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm that, once `freeze_stats` is set, always normalises with its running statistics
    (in train mode too) while its affine weight and bias still train."""

    freeze_stats: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.freeze_stats:
            return super().forward(x)
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            training=False, eps=self.eps)


def conv_block(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
                         FrozenStatsBatchNorm2d(out_channels), nn.ReLU())


class StripeCNN(nn.Module):
    def __init__(self, num_classes: int, width: int = 16) -> None:
        super().__init__()
        self.block1 = conv_block(CHANNELS, width)
        self.block2 = conv_block(width, 2 * width)
        self.block3 = conv_block(2 * width, 4 * width)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(4 * width, num_classes)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.block1(images))
        x = self.pool(self.block2(x))
        return self.block3(x).mean(dim=(2, 3))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))

    def freeze_norm_stats(self) -> None:
        for module in self.modules():
            if isinstance(module, FrozenStatsBatchNorm2d):
                module.freeze_stats = True


def _pretrain(model: nn.Module) -> None:
    """Four-orientation classification, batch statistics on: about 2 s on one core."""
    generator = torch.Generator().manual_seed(1234)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    model.train()
    for _ in range(250):
        images, labels = labelled_batch(PRETRAIN_CLASSES, 64, generator)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def base_model() -> StripeCNN:
    """The pre-trained four-orientation CNN."""
    with torch.random.fork_rng():  # fixed initial weights, without touching the caller's RNG
        torch.manual_seed(0)
        model = StripeCNN(len(PRETRAIN_CLASSES))
    return pretrained("image_cls_stripecnn16_orient4_noise04_adamw250", model, _pretrain)


# -- workload ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recipe:
    lr: float = SANE_LR
    batch_size: int = BATCH
    autocast: torch.dtype | None = None
    grad_scaler: bool = False
    input_range: float = 1.0
    """Multiplier on every training image: 255 is the missing /255."""
    poison: str = ""
    """What the batch at `onset` carries: "nan", "inf", "outlier" or nothing."""
    outlier_gain: float = 1000.0
    onset: int = ONSET
    burst: int = 1
    """How many consecutive batches from `onset` carry the poison."""
    large_activations: bool = False
    """Start from the base checkpoint with large intermediate activations (fp16_overflow)."""


def _with_large_activations(model: StripeCNN, gain: float) -> None:
    """Scale block 2's output by `gain` and block 3's BatchNorm statistics to match: the same
    function in exact arithmetic, with block 3's convolution output `gain` times larger."""
    with torch.no_grad():
        norm2, norm3 = model.block2[1], model.block3[1]
        norm2.weight.mul_(gain)
        norm2.bias.mul_(gain)
        norm3.running_mean.mul_(gain)
        norm3.running_var.mul_(gain * gain)
        norm3.eps *= gain * gain


def build(seed: int, recipe: Recipe) -> Workload:
    model = base_model()
    model.head = nn.Linear(model.head.in_features, len(FINETUNE_CLASSES))
    head_generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.head.weight.copy_(0.02 * torch.randn(model.head.weight.shape,
                                                   generator=head_generator))
        model.head.bias.zero_()
    model.freeze_norm_stats()
    if recipe.large_activations:
        _with_large_activations(model, FP16_ACTIVATION_GAIN)
    model.train()

    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01)

    def schedule(step: int) -> float:
        warm = min(1.0, (step + 1) / WARMUP)
        return warm * 0.5 * (1 + math.cos(math.pi * min(step, STEPS) / STEPS))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)

    def batch(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(
            (seed * 1_000_003 + step * 1_009 + micro) % 2**63)
        images, labels = labelled_batch(FINETUNE_CLASSES, recipe.batch_size, generator)
        images = images * recipe.input_range
        if recipe.poison and recipe.onset <= step < recipe.onset + recipe.burst:
            if recipe.poison == "nan":
                images[3, :, 4:9, 4:9] = math.nan  # a corrupt image decoded into NaNs
            elif recipe.poison == "inf":
                images[5, 1, 7, 7] = math.inf  # one pixel divided by zero
            elif recipe.poison == "outlier":
                images = images * recipe.outlier_gain
        return images, labels

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor],
             step: int) -> torch.Tensor:
        images, labels = batch
        return F.cross_entropy(model(images).float(), labels)

    held_out_generator = torch.Generator().manual_seed(10_000 + seed)
    held_out = [labelled_batch(FINETUNE_CLASSES, 128, held_out_generator) for _ in range(4)]

    return Workload(
        model=model, optimizer=optimizer, batch=batch, loss=loss,
        evaluate=lambda m: lm_eval(m, held_out, loss), scheduler=scheduler,
        scaler=torch.amp.GradScaler("cpu") if recipe.grad_scaler else None,
        autocast=recipe.autocast, batch_size=recipe.batch_size,
        notes={"sane_lr": SANE_LR, "lr": recipe.lr})


def _scenario(name: str, recipe: Recipe, description: str, *, cause: str | None = None,
              onset_step: int | None = None, sudden: bool = True, severity: str = "",
              recoverable: bool = True) -> Scenario:
    return Scenario(name=f"{FAMILY}_{name}", family=FAMILY,
                    build=functools.partial(build, recipe=recipe), steps=STEPS, cause=cause,
                    onset_step=onset_step, sudden=sudden, severity=severity,
                    description=description, recoverable=recoverable)


BASELINES: dict[str, str] = {
    f"{FAMILY}_input_scale": f"{FAMILY}_healthy",
    f"{FAMILY}_nan_input": f"{FAMILY}_healthy",
    f"{FAMILY}_inf_input": f"{FAMILY}_healthy",
    f"{FAMILY}_outlier_1000x": f"{FAMILY}_healthy",
    f"{FAMILY}_outlier_100x": f"{FAMILY}_healthy",
    f"{FAMILY}_outlier_burst": f"{FAMILY}_healthy",
    f"{FAMILY}_nan_burst": f"{FAMILY}_healthy",
    f"{FAMILY}_fp16_overflow": f"{FAMILY}_healthy_fp16",
}
"""The healthy scenario of the same model and precision that each faulty one is measured
against (its final eval loss under no protection is the reference)."""


def scenarios() -> list[Scenario]:
    sane = f"AdamW {SANE_LR:g} warmup {WARMUP} + cosine"
    return [
        _scenario("healthy", Recipe(),
                  f"healthy fp32 fine-tune of a pre-trained CNN on 6 stripe classes, {sane}"),
        _scenario("healthy_bf16", Recipe(autocast=torch.bfloat16, batch_size=48),
                  f"healthy fine-tune under bf16 autocast, batch 48, {sane}"),
        _scenario("healthy_fp16", Recipe(autocast=torch.float16, grad_scaler=True),
                  f"healthy fine-tune under fp16 autocast with a GradScaler, {sane}"),
        _scenario("input_scale", Recipe(input_range=255.0),
                  "images fed in [0, 255] (missing /255) to a CNN pre-trained on [0, 1], "
                  "frozen BatchNorm statistics",
                  cause="input_scale", onset_step=0, sudden=False, recoverable=False),
        _scenario("nan_input", Recipe(poison="nan"),
                  f"one image of the batch at step {ONSET} is NaN (corrupt decode)",
                  cause="nonfinite_input", onset_step=ONSET),
        _scenario("inf_input", Recipe(poison="inf"),
                  f"one pixel of the batch at step {ONSET} is +Inf (division by zero)",
                  cause="nonfinite_input", onset_step=ONSET),
        _scenario("outlier_1000x", Recipe(poison="outlier", outlier_gain=1000.0),
                  f"the batch at step {ONSET} is 1000x its normal magnitude",
                  cause="outlier_batch", onset_step=ONSET, severity="severe"),
        _scenario("outlier_100x", Recipe(poison="outlier", outlier_gain=100.0),
                  f"the batch at step {ONSET} is 100x its normal magnitude",
                  cause="outlier_batch", onset_step=ONSET, severity="mild"),
        _scenario("outlier_burst", Recipe(poison="outlier", outlier_gain=100.0, burst=BURST),
                  f"{BURST} consecutive batches from step {ONSET} are 100x their normal magnitude "
                  "(a shard of raw, unnormalised sensor values)",
                  cause="outlier_batch", onset_step=ONSET, severity="severe"),
        _scenario("nan_burst", Recipe(poison="nan", burst=BURST),
                  f"one image of each of the {BURST} batches from step {ONSET} is NaN (a corrupt "
                  "shard)",
                  cause="nonfinite_input", onset_step=ONSET),
        _scenario("fp16_overflow",
                  Recipe(autocast=torch.float16, grad_scaler=True, large_activations=True),
                  f"fp16 autocast + GradScaler from a checkpoint whose block-2 activations are "
                  f"{FP16_ACTIVATION_GAIN:g}x larger (same function in fp32): they pass 65504 "
                  "in fp16",
                  cause="fp16_overflow", onset_step=0, recoverable=False),
    ]
