"""Diffusion: fine-tuning a tiny pre-trained UNet denoiser with the DDPM objective.

Model. `TinyUNet`: a plain-torch UNet for 3x16x16 images: a stem convolution, residual blocks
(GroupNorm, SiLU, 3x3 convolutions, the timestep embedding added in between) at 16x16 and 8x8,
a strided-convolution downsample, a nearest-neighbour upsample, a skip connection that
concatenates the 16x16 features into the decoder, and a zero-initialised output convolution. The
timestep enters through a sinusoidal embedding and a small MLP.

Objective. DDPM epsilon prediction: for a clean image x0 in [-1, 1], a timestep t drawn uniformly
from a fixed linear beta schedule of NUM_TIMESTEPS steps and Gaussian noise eps, the model sees
x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps and is trained with the MSE between its prediction
and eps. Predicting zero scores 1.0; a useful denoiser scores far below. Held-out loss: the same
MSE on fixed (x0, t, eps) triples.

Data. The base model is pre-trained briefly on soft-edged discs of random colour, position and
radius on a vertical-gradient background; fine-tuning moves it to a related distribution:
rectangles filled with two-colour stripes on a horizontal-gradient background, whose texture the
base model first mistakes for noise.

Recipe. AdamW at the sane peak learning rate SANE_LR with a linear warmup of WARMUP steps and
cosine decay, batch 32, as in the usual DDPM / Stable Diffusion fine-tuning scripts.

Faults (cause codes from trainguard.diagnose.causes, with the guide's section; 5.2 describes
Stable Diffusion fine-tunes whose samples turn into colour noise):
- lr_too_high (3.1): the guide's 100x of the sane full fine-tuning rate. Adam's normalised steps
  of that size wreck the pre-trained filters within the warmup; the loss shoots up, then the
  denoiser collapses to predicting almost nothing (MSE ~1.0) and never recovers.
- missing_warmup (3.1, 6): a peak rate of NO_WARMUP_LR, which trains as well as SANE_LR behind a
  warmup, applied from the first step. The first full-size Adam steps, taken while the moment
  estimates are still noisy, knock the model into the same collapse (on some seeds it crawls
  part of the way back).
- lr_too_high, transient (3.1): a misconfigured restart of the schedule multiplies the LR by
  LR_SPIKE_FACTOR for LR_SPIKE_STEPS scheduler steps from ONSET, then the schedule is back to
  normal. The spike lives in the schedule, so it comes back whenever the scheduler is rewound to
  before it (a rollback restores the scheduler's state with the model's).
- nonfinite_input (3.2): one image of the batch at ONSET carries NaNs (a corrupt file). The
  noised input, the loss and every gradient become NaN, and one unprotected AdamW step writes
  NaN into all the weights.
An outlier batch (1000x or 100x the normal magnitude) is no fault for this model: the GroupNorms
of the residual blocks rescale it, and the unprotected run ends within ~10% of the healthy one.
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

FAMILY = "diffusion"
IMAGE_SIZE = 16
CHANNELS = 3
NUM_TIMESTEPS = 100
BETA_START, BETA_END = 1e-3, 0.2
"""The standard 1e-4..0.02 linear schedule for 1000 steps, rescaled to NUM_TIMESTEPS."""

SANE_LR = 1e-2
HIGH_LR = 3e-2
"""AdamW peak learning rate at which this tiny UNet fine-tunes well with warmup (calibrated: 5e-3
to 2e-2 all train well, 4e-2 diverges on some seeds; tiny models take larger rates than the
guide's 1e-6..5e-5 for 7B models)."""
NO_WARMUP_LR = 2 * SANE_LR
"""The top of the good range: as good as SANE_LR with warmup, unstable without it."""
STEPS = 200
WARMUP = 20
BATCH = 32
ONSET = 80
PRETRAIN_STEPS = 200
GROUPS = 4
"""GroupNorm groups in every block."""
LR_SPIKE_FACTOR = 20.0
LR_SPIKE_STEPS = 5
STRIPE_CYCLES = 4.0
"""Stripes per image width inside the fine-tuning rectangles."""


# -- data ----------------------------------------------------------------------------------------
def _grid() -> tuple[torch.Tensor, torch.Tensor]:
    coords = (torch.arange(IMAGE_SIZE, dtype=torch.float32) + 0.5) / IMAGE_SIZE
    return torch.meshgrid(coords, coords, indexing="ij")


def disc_images(n: int, generator: torch.Generator) -> torch.Tensor:
    """Pre-training images: a soft disc of random colour on a vertical gradient, in [-1, 1]."""
    ys, xs = _grid()
    rand = functools.partial(torch.rand, generator=generator)
    centre_y, centre_x = 0.2 + 0.6 * rand(n, 1, 1), 0.2 + 0.6 * rand(n, 1, 1)
    radius = 0.15 + 0.2 * rand(n, 1, 1)
    distance = ((ys - centre_y) ** 2 + (xs - centre_x) ** 2).sqrt()
    mask = torch.sigmoid((radius - distance) * 40.0)[:, None]
    top, bottom = rand(n, CHANNELS, 1, 1) * 0.6, rand(n, CHANNELS, 1, 1) * 0.6
    background = top + (bottom - top) * ys
    colour = rand(n, CHANNELS, 1, 1)
    images = background * (1 - mask) + colour * mask
    return images * 2 - 1


def striped_rectangle_images(n: int, generator: torch.Generator) -> torch.Tensor:
    """Fine-tuning images: a rectangle filled with two-colour stripes (horizontal or vertical)
    on a horizontal gradient, in [-1, 1]."""
    ys, xs = _grid()
    rand = functools.partial(torch.rand, generator=generator)
    half_h, half_w = 0.15 + 0.2 * rand(n, 1, 1), 0.15 + 0.2 * rand(n, 1, 1)
    centre_y, centre_x = 0.3 + 0.4 * rand(n, 1, 1), 0.3 + 0.4 * rand(n, 1, 1)
    inside_y = torch.sigmoid((half_h - (ys - centre_y).abs()) * 40.0)
    inside_x = torch.sigmoid((half_w - (xs - centre_x).abs()) * 40.0)
    mask = (inside_y * inside_x)[:, None]
    left, right = 0.4 + 0.6 * rand(n, CHANNELS, 1, 1), 0.4 + 0.6 * rand(n, CHANNELS, 1, 1)
    background = left + (right - left) * xs
    across = torch.where(rand(n, 1, 1) < 0.5, xs, ys)
    phase = 2 * math.pi * rand(n, 1, 1)
    stripes = (torch.sin(2 * math.pi * STRIPE_CYCLES * across + phase) > 0).float()[:, None]
    first, second = rand(n, CHANNELS, 1, 1), rand(n, CHANNELS, 1, 1)
    fill = first * stripes + second * (1 - stripes)
    images = background * (1 - mask) + fill * mask
    return images * 2 - 1


@dataclass(frozen=True)
class NoiseSchedule:
    alpha_bar: torch.Tensor

    @staticmethod
    def linear() -> NoiseSchedule:
        betas = torch.linspace(BETA_START, BETA_END, NUM_TIMESTEPS)
        return NoiseSchedule(torch.cumprod(1 - betas, dim=0))

    def noised(self, clean: torch.Tensor, timesteps: torch.Tensor,
               noise: torch.Tensor) -> torch.Tensor:
        alpha_bar = self.alpha_bar[timesteps][:, None, None, None]
        return alpha_bar.sqrt() * clean + (1 - alpha_bar).sqrt() * noise


def diffusion_batch(images: torch.Tensor,
                    generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(clean images, timesteps, noise): everything random in one DDPM training example."""
    timesteps = torch.randint(NUM_TIMESTEPS, (images.shape[0],), generator=generator)
    noise = torch.randn(images.shape, generator=generator)
    return images, timesteps, noise


def epsilon_loss(model: nn.Module, schedule: NoiseSchedule,
                 batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    clean, timesteps, noise = batch
    predicted = model(schedule.noised(clean, timesteps, noise), timesteps)
    return F.mse_loss(predicted.float(), noise)


# -- model ---------------------------------------------------------------------------------------
def timestep_embedding(timesteps: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    frequencies = torch.exp(-math.log(10_000.0) * torch.arange(half, dtype=torch.float32) / half)
    angles = timesteps.float()[:, None] * frequencies[None]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


class ResBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, time_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(GROUPS, in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.time = nn.Linear(time_dim, out_channels)
        self.norm2 = nn.GroupNorm(GROUPS, out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.shortcut = (nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels
                         else nn.Identity())

    def forward(self, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time(time)[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.shortcut(x) + h


class TinyUNet(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        time_dim = 2 * width
        self.width = width
        self.time_mlp = nn.Sequential(nn.Linear(width, time_dim), nn.SiLU(),
                                      nn.Linear(time_dim, time_dim))
        self.stem = nn.Conv2d(CHANNELS, width, 3, padding=1)
        self.down_block = ResBlock(width, width, time_dim)
        self.downsample = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.mid_block = ResBlock(2 * width, 2 * width, time_dim)
        self.upsample = nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"),
                                      nn.Conv2d(2 * width, width, 3, padding=1))
        self.up_block = ResBlock(2 * width, width, time_dim)
        self.out_norm = nn.GroupNorm(GROUPS, width)
        self.out = nn.Conv2d(width, CHANNELS, 3, padding=1)
        nn.init.zeros_(self.out.weight)  # start by predicting zero noise, as DDPM UNets do
        nn.init.zeros_(self.out.bias)

    def forward(self, noisy: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        time = self.time_mlp(timestep_embedding(timesteps, self.width))
        skip = self.down_block(self.stem(noisy), time)
        h = self.mid_block(self.downsample(skip), time)
        h = self.up_block(torch.cat([self.upsample(h), skip], dim=1), time)
        return self.out(F.silu(self.out_norm(h)))


def _pretrain(model: nn.Module) -> None:
    """DDPM on the disc images."""
    generator = torch.Generator().manual_seed(4321)
    schedule = NoiseSchedule.linear()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    model.train()
    for _ in range(PRETRAIN_STEPS):
        batch = diffusion_batch(disc_images(32, generator), generator)
        loss = epsilon_loss(model, schedule, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def base_model() -> TinyUNet:
    """The UNet pre-trained on discs."""
    with torch.random.fork_rng():  # fixed initial weights, without touching the caller's RNG
        torch.manual_seed(0)
        model = TinyUNet()
    return pretrained(f"diffusion_tinyunet16_discs_adamw{PRETRAIN_STEPS}", model, _pretrain)


# -- workload ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recipe:
    lr: float = SANE_LR
    warmup: int = WARMUP
    batch_size: int = BATCH
    autocast: torch.dtype | None = None
    nan_image_at: int | None = None
    """Step whose batch carries a NaN image."""
    lr_spike_at: int | None = None
    """Scheduler step from which the LR is LR_SPIKE_FACTOR times the schedule's, for
    LR_SPIKE_STEPS steps (a misconfigured restart of the schedule)."""
    sgd: bool = False
    """SGD with momentum 0.9 instead of AdamW."""
    zero_target_from: int | None = None
    """label_problem: from this step a refactored data pipeline hands the loss a target of
    zeros instead of the noise it added (the noise tensor is re-created after use)."""


def build(seed: int, recipe: Recipe) -> Workload:
    model = base_model()
    model.train()
    schedule = NoiseSchedule.linear()
    optimizer: torch.optim.Optimizer = (
        torch.optim.SGD(model.parameters(), lr=recipe.lr, momentum=0.9) if recipe.sgd else
        torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01))

    def lr_factor(step: int) -> float:
        warm = min(1.0, (step + 1) / recipe.warmup) if recipe.warmup else 1.0
        factor = warm * 0.5 * (1 + math.cos(math.pi * min(step, STEPS) / STEPS))
        if recipe.lr_spike_at is not None \
                and recipe.lr_spike_at <= step < recipe.lr_spike_at + LR_SPIKE_STEPS:
            factor *= LR_SPIKE_FACTOR
        return factor

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)

    def batch(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(
            (seed * 1_000_003 + step * 1_009 + micro) % 2**63)
        images = striped_rectangle_images(recipe.batch_size, generator)
        if step == recipe.nan_image_at:
            images[2, :, 6:10, 6:10] = math.nan  # a corrupt image decoded into NaNs
        return diffusion_batch(images, generator)

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
             step: int) -> torch.Tensor:
        if recipe.zero_target_from is not None and step >= recipe.zero_target_from:
            clean, timesteps, noise = batch
            predicted = model(schedule.noised(clean, timesteps, noise), timesteps)
            return F.mse_loss(predicted.float(), torch.zeros_like(noise))
        return epsilon_loss(model, schedule, batch)

    held_out_generator = torch.Generator().manual_seed(20_000 + seed)
    held_out = [diffusion_batch(striped_rectangle_images(64, held_out_generator),
                                held_out_generator) for _ in range(4)]

    return Workload(
        model=model, optimizer=optimizer, batch=batch, loss=loss,
        evaluate=lambda m: lm_eval(m, held_out, loss), scheduler=scheduler,
        autocast=recipe.autocast, batch_size=recipe.batch_size,
        notes={"sane_lr": SANE_LR, "lr": recipe.lr, "warmup": recipe.warmup})


def _scenario(name: str, recipe: Recipe, description: str, *, cause: str | None = None,
              onset_step: int | None = None, sudden: bool = True, severity: str = "",
              recoverable: bool = True) -> Scenario:
    return Scenario(name=f"{FAMILY}_{name}", family=FAMILY,
                    build=functools.partial(build, recipe=recipe), steps=STEPS, cause=cause,
                    onset_step=onset_step, sudden=sudden, severity=severity,
                    description=description, recoverable=recoverable)


BASELINES: dict[str, str] = {
    f"{FAMILY}_lr_too_high": f"{FAMILY}_healthy",
    f"{FAMILY}_missing_warmup": f"{FAMILY}_healthy",
    f"{FAMILY}_nan_input": f"{FAMILY}_healthy",
    f"{FAMILY}_lr_spike": f"{FAMILY}_healthy",
    f"{FAMILY}_zero_target": f"{FAMILY}_healthy",
}
"""The healthy scenario of the same model and precision that each faulty one is measured
against (its final eval loss under no protection is the reference)."""


def scenarios() -> list[Scenario]:
    sane = f"AdamW {SANE_LR:g} warmup {WARMUP} + cosine"
    return [
        _scenario("healthy", Recipe(),
                  f"healthy fp32 DDPM fine-tune of a tiny UNet from discs to striped rectangles, "
                  f"{sane}"),
        _scenario("healthy_bf16", Recipe(autocast=torch.bfloat16, batch_size=48),
                  f"healthy DDPM fine-tune under bf16 autocast, batch 48, {sane}"),
        _scenario("healthy_high_lr", Recipe(lr=HIGH_LR),
                  f"healthy fp32 DDPM fine-tune at a higher LR: AdamW {HIGH_LR:g} (3x sane), "
                  f"warmup {WARMUP} + cosine"),
        _scenario("lr_too_high", Recipe(lr=100 * SANE_LR),
                  f"AdamW lr {100 * SANE_LR:g} = 100x the sane {SANE_LR:g} (the guide's multiple "
                  "for full fine-tuning), warmup + cosine",
                  cause="lr_too_high", onset_step=0, sudden=False, recoverable=False),
        _scenario("missing_warmup", Recipe(lr=NO_WARMUP_LR, warmup=0),
                  f"AdamW lr {NO_WARMUP_LR:g} (2x sane; trains as well as {SANE_LR:g} with "
                  f"{WARMUP} warmup steps) started with no warmup, cosine decay",
                  cause="missing_warmup", onset_step=0, sudden=False, recoverable=False),
        _scenario("nan_input", Recipe(nan_image_at=ONSET),
                  f"one image of the batch at step {ONSET} is NaN (corrupt decode)",
                  cause="nonfinite_input", onset_step=ONSET),
        _scenario("lr_spike", Recipe(lr_spike_at=ONSET),
                  f"a misconfigured schedule restart: from step {ONSET} the LR is "
                  f"{LR_SPIKE_FACTOR:g}x the schedule's for {LR_SPIKE_STEPS} steps, then back",
                  cause="lr_too_high", onset_step=ONSET),
        _scenario("zero_target", Recipe(zero_target_from=ONSET),
                  f"from step {ONSET} the loss's target is zeros instead of the added noise (a "
                  "data-pipeline bug): the denoiser learns to predict nothing, its predicted "
                  "noise collapses while the training loss falls to zero",
                  cause="label_problem", onset_step=ONSET, sudden=False, recoverable=False),
    ]
