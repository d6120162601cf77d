"""Diffusers: fine-tuning the diffusion library's own models, as its training examples do.

Models. Built from configs, never downloaded: a tiny `diffusers.UNet2DModel` (two resolutions,
16 and 32 channels, a mid block with attention) on 3x16x16 images, a `DDPMScheduler` of
NUM_TIMESTEPS steps, and for latent diffusion a tiny `AutoencoderKL` (3x16x16 images to 4x8x8
latents) with a UNet of the same kind on its latents. The pixel and latent UNets are
pre-trained briefly on soft discs, the autoencoder on discs and stripes; fine-tuning moves them
to striped rectangles (the data of the `diffusion` family).

Loop. `train_unconditional.py` / `train_text_to_image.py`: noise and timesteps drawn per batch,
`noise_scheduler.add_noise`, the UNet's prediction against the scheduler's target (the noise
under `prediction_type="epsilon"`), MSE; latent diffusion encodes the images with the VAE
(`latent_dist.sample() * scaling_factor`) as the example does, relying on the VAE being frozen.
AdamW at SANE_LR, warmup and cosine decay, batch BATCH. The guide's remedies are trainguard's
recipes: the healthy latent run freezes the VAE with `recipes.freeze_parts`, a healthy twin
trains LoRA adapters made by `recipes.unet_lora`.

Faults made as users make them (cause codes from trainguard.diagnose.causes):
- lr_too_high: AdamW at HIGH_LR (0.5), far above anything this UNet takes.
- unfrozen_part: the latent model's VAE neither frozen nor kept out of the optimizer (the
  optimizer is built from the whole pipeline's parameters); the encoder learns to shrink the
  latents, which makes the noise trivially predictable: the loss falls while the samples die.
- input_scale: the images handed over in [0, 255] (a `ToTensor()`-less pipeline) instead of the
  [-1, 1] the pre-trained UNet saw.
- input_scale (layout): the images decoded channel-last (H, W, C, as PIL and numpy hold them)
  and turned channel-first with `.reshape` instead of `.permute`: every pixel's values land in
  other places, and the picture is scrambled into noise-like texture.
- optimizer_eps: the UNet cast to float16 (`unet.half()`, a memory saving) and trained with
  AdamW and no scaler: Adam's eps of 1e-8 rounds to 0 in float16, its second moments underflow,
  and the first update leaves weights non-finite. The preflight names the float16 parameters.
- lr_too_high (raised): a loop at a constant LR, no schedule and so no warmup (as the
  diffusion page's example is written), whose own code multiplies the LR by RAISE at step
  RAISED_AT: the ten steps before went well, the first steps' trouble is the raise's.
- bad_init: a new class-conditioning layer (`class_embed_type="timestep"`, added to the
  pre-trained UNet for fine-tuning) initialised with std BAD_INIT_STD.
- prediction_type_mismatch: the loop scores the UNet against the velocity
  (`target = noise_scheduler.get_velocity(clean, noise, timesteps)`, as a v-prediction script
  does) while its scheduler, the one that samples, says `prediction_type="epsilon"`. The loss
  falls smoothly; nothing in its level says which target is the right one. The loop hands the
  Guard its scheduler (`Guard(noise_scheduler=...)`), as every run of this family does.
Not made either: float16 autocast without a scaler (the CPU's autocast is bfloat16 by default;
the float16 weights above are the form a CPU run takes).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL, DDPMScheduler, UNet2DModel
from torch import nn

from trainguard.recipes import freeze_parts, unet_lora

from ..base import Scenario, Workload, lm_eval
from ..pretrain import pretrained
from .diffusion import disc_images, striped_rectangle_images

FAMILY = "diffusers"
IMAGE_SIZE = 16
LATENT_SIZE = 8
LATENT_CHANNELS = 4
NUM_TIMESTEPS = 100
BETA_START, BETA_END = 1e-3, 0.2
"""The standard linear schedule of 1000 steps (1e-4..0.02) rescaled to NUM_TIMESTEPS."""
SANE_LR = 2e-3
HIGH_LR = 0.5
STEPS = 60
WARMUP = 6
BATCH = 16
PRETRAIN_STEPS = 250
RAISED_AT = 10
RAISE = 1000.0
BAD_INIT_STD = 3.0
"""The new conditioning layer's weight std: 12x Kaiming's for its 16 inputs, 24x for its 64."""


# -- models --------------------------------------------------------------------------------------
def tiny_unet(in_channels: int = 3, sample_size: int = IMAGE_SIZE,
              class_embed_type: str | None = None) -> UNet2DModel:
    return UNet2DModel(sample_size=sample_size, in_channels=in_channels,
                       out_channels=in_channels, layers_per_block=1,
                       block_out_channels=(16, 32),
                       down_block_types=("DownBlock2D", "DownBlock2D"),
                       up_block_types=("UpBlock2D", "UpBlock2D"), norm_num_groups=8,
                       attention_head_dim=8, class_embed_type=class_embed_type)


def tiny_vae() -> AutoencoderKL:
    return AutoencoderKL(in_channels=3, out_channels=3,
                         down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
                         up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
                         block_out_channels=(16, 32), latent_channels=LATENT_CHANNELS,
                         norm_num_groups=8, sample_size=IMAGE_SIZE)


def noise_scheduler() -> DDPMScheduler:
    return DDPMScheduler(num_train_timesteps=NUM_TIMESTEPS, beta_start=BETA_START,
                         beta_end=BETA_END)


class LatentDiffusion(nn.Module):
    """The original Stable Diffusion code's layout: the denoiser and the autoencoder in one
    module, the autoencoder under its name there, `first_stage_model`."""

    def __init__(self, unet: UNet2DModel, vae: AutoencoderKL) -> None:
        super().__init__()
        self.unet = unet
        self.first_stage_model = vae

    def latents(self, images: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        vae = self.first_stage_model
        distribution = vae.encode(images).latent_dist
        return distribution.sample(generator) * vae.config.scaling_factor


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed % 2**63)


def denoising_loss(unet: UNet2DModel, scheduler: DDPMScheduler, clean: torch.Tensor,
                   generator: torch.Generator, class_labels: torch.Tensor | None = None,
                   velocity: bool = False) -> torch.Tensor:
    """One batch of the diffusers examples' objective (`velocity`: scored against the velocity
    whatever the scheduler's prediction_type)."""
    noise = torch.randn(clean.shape, generator=generator).to(clean.dtype)
    timesteps = torch.randint(0, NUM_TIMESTEPS, (clean.shape[0],), generator=generator)
    noisy = scheduler.add_noise(clean, noise, timesteps)
    predicted = unet(noisy, timesteps, class_labels=class_labels).sample
    if velocity or scheduler.config.prediction_type == "v_prediction":
        target = scheduler.get_velocity(clean, noise, timesteps)
    else:
        target = noise
    return F.mse_loss(predicted.float(), target.float())


def _pretrain_unet(unet: nn.Module, images: Any) -> None:
    scheduler = noise_scheduler()
    generator = _seeded(4321)
    optimizer = torch.optim.AdamW(unet.parameters(), lr=2e-3, weight_decay=0.01)
    for _ in range(PRETRAIN_STEPS):
        clean = images(generator)
        loss = denoising_loss(unet, scheduler, clean, generator)  # type: ignore[arg-type]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def base_unet() -> UNet2DModel:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        unet = tiny_unet()
    return pretrained(f"diffusers_unet16_discs_adamw{PRETRAIN_STEPS}", unet,
                      lambda m: _pretrain_unet(m, lambda g: disc_images(32, g)))


def _pretrain_vae(vae: nn.Module) -> None:
    generator = _seeded(1234)
    optimizer = torch.optim.AdamW(vae.parameters(), lr=2e-3)
    for _ in range(PRETRAIN_STEPS):
        images = torch.cat([disc_images(16, generator), striped_rectangle_images(16, generator)])
        posterior = vae.encode(images).latent_dist  # type: ignore[operator]
        decoded = vae.decode(posterior.sample(generator)).sample  # type: ignore[operator]
        loss = F.mse_loss(decoded, images) + 1e-4 * posterior.kl().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def base_vae() -> AutoencoderKL:
    """The autoencoder, its `scaling_factor` set as Stable Diffusion's was: one over the std of
    its latents, so the UNet sees latents of unit scale."""
    with torch.random.fork_rng():
        torch.manual_seed(1)
        vae = tiny_vae()
    vae = pretrained(f"diffusers_vae16_adamw{PRETRAIN_STEPS}", vae, _pretrain_vae)
    with torch.no_grad():
        images = disc_images(64, _seeded(99))
        std = float(vae.encode(images).latent_dist.mean.std())
    vae.register_to_config(scaling_factor=1.0 / std)
    return vae


def base_latent_diffusion() -> LatentDiffusion:
    vae = base_vae().requires_grad_(False)

    def pretrain(unet: nn.Module) -> None:
        with torch.no_grad():
            cache = [LatentDiffusion(tiny_unet(), vae).latents(disc_images(32, g), g)
                     for g in [_seeded(7000 + i) for i in range(PRETRAIN_STEPS)]]
        it = iter(cache)
        _pretrain_unet(unet, lambda g: next(it))

    with torch.random.fork_rng():
        torch.manual_seed(2)
        unet = tiny_unet(LATENT_CHANNELS, LATENT_SIZE)
    unet = pretrained(f"diffusers_latent_unet8_discs_adamw{PRETRAIN_STEPS}", unet, pretrain)
    return LatentDiffusion(unet, vae.requires_grad_(True))


def class_conditioned(unet: UNet2DModel, init_std: float | None) -> UNet2DModel:
    """The pre-trained UNet with a new class-conditioning layer (`class_embed_type=
    "timestep"`), as a fine-tune that adds conditioning builds it: the config's model with the
    pre-trained weights loaded, the new layer at diffusers' init, or `init_std` if given."""
    with torch.random.fork_rng():
        torch.manual_seed(3)
        conditioned = tiny_unet(class_embed_type="timestep")
    missing, unexpected = conditioned.load_state_dict(unet.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("class_embedding.") for k in missing)
    if init_std is not None:
        with torch.random.fork_rng(), torch.no_grad():
            torch.manual_seed(4)
            for module in conditioned.class_embedding.modules():
                if isinstance(module, nn.Linear):
                    module.weight.normal_(0.0, init_std)
    return conditioned


# -- workload ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recipe:
    lr: float = SANE_LR
    latent: bool = False
    train_vae: bool = False
    """Latent diffusion with the VAE left trainable and in the optimizer."""
    pixels_255: bool = False
    half: bool = False
    """The UNet and the images cast to float16 (`.half()`), trained without autocast's float32
    master weights nor a gradient scaler."""
    reshaped: bool = False
    """Channel-last images reshaped, not permuted, to channel-first."""
    conditioned: bool = False
    init_std: float | None = None
    lora: bool = False
    """LoRA adapters on the UNet (`recipes.unet_lora`), the base weights frozen."""
    velocity_target: bool = False
    """The loss scored against the velocity, the scheduler's prediction_type left at epsilon."""
    scheduled: bool = True
    """Warmup and cosine decay; False: a constant LR."""
    raised_at: int | None = None
    """The step at which the loop's own code multiplies the LR by RAISE."""


def _images(recipe: Recipe, n: int, generator: torch.Generator) -> torch.Tensor:
    images = striped_rectangle_images(n, generator)
    if recipe.reshaped:  # decoded as (H, W, C), then the mistaken turn to (C, H, W)
        images = images.permute(0, 2, 3, 1).contiguous().reshape(images.shape)
    images = (images + 1) * 127.5 if recipe.pixels_255 else images
    return images.half() if recipe.half else images


def build(seed: int, recipe: Recipe) -> Workload:
    scheduler = noise_scheduler()
    model: nn.Module
    if recipe.latent:
        model = base_latent_diffusion()
        unet = model.unet
    else:
        unet = base_unet()
        if recipe.conditioned:
            unet = class_conditioned(unet, recipe.init_std)
        if recipe.half:
            unet = unet.half()
        if recipe.lora:
            with torch.random.fork_rng():
                torch.manual_seed(5)
                unet = unet_lora(unet, r=4)
        model = unet
    model.train()
    # the whole pipeline's trainable parameters, as a script that forgets the VAE builds it
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=recipe.lr, weight_decay=0.01)
    if not recipe.train_vae:
        freeze_parts(model, optimizer)  # the guide's remedy: the VAE frozen, out of the optimizer

    def lr_factor(step: int) -> float:
        warm = min(1.0, (step + 1) / WARMUP)
        return warm * 0.5 * (1 + math.cos(math.pi * min(step, STEPS) / STEPS))

    lr_scheduler = (torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor) if recipe.scheduled
                    else None)

    def raise_lr(step: int) -> None:
        if step == recipe.raised_at:
            for group in optimizer.param_groups:
                group["lr"] *= RAISE

    def batch(step: int, micro: int) -> dict[str, Any]:
        key = seed * 1_000_003 + step * 1_009 + micro
        return batch_of(_images(recipe, BATCH, _seeded(key)), key, recipe.conditioned)

    def loss(model: nn.Module, batch: dict[str, Any], step: int) -> torch.Tensor:
        # the noise and timesteps of a batch are drawn from its own key, so a replay of the
        # step draws the same
        generator = _seeded(batch["key"] * 7_919 + 17)
        clean = batch["pixel_values"]
        if isinstance(model, LatentDiffusion):
            clean = model.latents(clean, generator)
            denoiser = model.unet
        else:
            denoiser = model  # type: ignore[assignment]
        return denoising_loss(denoiser, scheduler, clean, generator,
                              batch.get("class_labels"), velocity=recipe.velocity_target)

    held_generator = _seeded(20_000 + seed)
    held_out = [batch_of(_images(recipe, 32, held_generator), -1 - i, recipe.conditioned)
                for i in range(4)]
    return Workload(model=model, optimizer=optimizer, batch=batch, loss=loss,
                    evaluate=lambda m: lm_eval(m, held_out, loss), scheduler=lr_scheduler,
                    batch_size=BATCH, notes={"sane_lr": SANE_LR, "lr": recipe.lr},
                    noise_scheduler=scheduler,
                    before_step=raise_lr if recipe.raised_at is not None else None)


def batch_of(images: torch.Tensor, key: int, conditioned: bool) -> dict[str, Any]:
    """A batch as a diffusers example's collate function makes it, with the key its noise is
    drawn from (a plain int: no tensor the batch inspector would read)."""
    out: dict[str, Any] = {"pixel_values": images, "key": key}
    if conditioned:
        out["class_labels"] = (images.mean(dim=(1, 2, 3)) > images.mean()).long()
    return out


def _scenario(name: str, recipe: Recipe, description: str, *, cause: str | None = None,
              recoverable: bool = False) -> Scenario:
    onset = recipe.raised_at or 0
    return Scenario(name=f"{FAMILY}_{name}", family=FAMILY,
                    build=functools.partial(build, recipe=recipe), steps=STEPS, cause=cause,
                    onset_step=None if cause is None else onset,
                    sudden=recipe.raised_at is not None,
                    description=description, recoverable=recoverable)


BASELINES: dict[str, str] = {
    f"{FAMILY}_lr_too_high": f"{FAMILY}_healthy",
    f"{FAMILY}_images_255": f"{FAMILY}_healthy",
    f"{FAMILY}_channels_scrambled": f"{FAMILY}_healthy",
    f"{FAMILY}_fp16_no_scaler": f"{FAMILY}_healthy",
    f"{FAMILY}_unfrozen_vae": f"{FAMILY}_healthy_latent",
    f"{FAMILY}_conditioning_init": f"{FAMILY}_healthy_conditioned",
    f"{FAMILY}_velocity_target": f"{FAMILY}_healthy",
    f"{FAMILY}_lr_raised": f"{FAMILY}_healthy_constant_lr",
}


def scenarios() -> list[Scenario]:
    sane = f"AdamW {SANE_LR:g}, warmup {WARMUP} + cosine"
    return [
        _scenario("healthy", Recipe(), f"a diffusers UNet2DModel fine-tuned on 16x16 images, "
                  f"{sane}"),
        _scenario("healthy_latent", Recipe(latent=True),
                  f"latent diffusion: a UNet on a frozen AutoencoderKL's latents, {sane}"),
        _scenario("healthy_lora", Recipe(lora=True),
                  f"LoRA (r=4) on the UNet's attention and resnet convolutions, {sane}"),
        _scenario("healthy_constant_lr", Recipe(scheduled=False),
                  f"the UNet at a constant AdamW {SANE_LR:g}, no schedule"),
        _scenario("healthy_conditioned", Recipe(conditioned=True),
                  f"the UNet with a new class-conditioning layer at diffusers' init, {sane}"),
        _scenario("lr_too_high", Recipe(lr=HIGH_LR), f"AdamW lr {HIGH_LR:g}",
                  cause="lr_too_high"),
        _scenario("unfrozen_vae", Recipe(latent=True, train_vae=True),
                  "latent diffusion with the VAE (`first_stage_model`) left trainable and in "
                  "the optimizer", cause="unfrozen_part"),
        _scenario("images_255", Recipe(pixels_255=True),
                  "the images handed over in [0, 255] instead of [-1, 1]", cause="input_scale"),
        _scenario("channels_scrambled", Recipe(reshaped=True),
                  "channel-last images reshaped to channel-first instead of permuted",
                  cause="input_scale"),
        _scenario("fp16_no_scaler", Recipe(half=True),
                  "the UNet cast to float16 with `.half()` and trained with AdamW, no scaler",
                  cause="optimizer_eps"),
        _scenario("conditioning_init", Recipe(conditioned=True, init_std=BAD_INIT_STD),
                  f"a new class-conditioning layer initialised with std {BAD_INIT_STD:g}",
                  cause="bad_init"),
        _scenario("lr_raised", Recipe(scheduled=False, raised_at=RAISED_AT),
                  f"a constant LR, no warmup, multiplied by {RAISE:g} by the loop's code at "
                  f"step {RAISED_AT}", cause="lr_too_high"),
        _scenario("velocity_target", Recipe(velocity_target=True),
                  "the loss scored against the velocity (v-prediction) while the noise "
                  "scheduler's prediction_type is epsilon", cause="prediction_type_mismatch"),
    ]
