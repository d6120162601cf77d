"""The guide's training recipes as tested helpers: LR schedules, progressive unfreezing, loss
stabilisers, head initialisation and diffusion fine-tuning's remedies. Each is independent of the
Guard and works in any loop."""

from trainguard.recipes.diffusion import (
    conv_clip,
    freeze_parts,
    pipeline_sampler,
    sampler,
    unet_lora,
)
from trainguard.recipes.init import HEAD_STD, init_new_head, kaiming_like_std
from trainguard.recipes.losses import capped_loss, capped_per_sample_loss, temperature_cross_entropy
from trainguard.recipes.schedules import (
    WarmupSchedule,
    warmup_cosine,
    warmup_cosine_factor,
    warmup_linear,
    warmup_linear_factor,
)
from trainguard.recipes.unfreeze import ProgressiveUnfreezer, layer_groups, unfreeze_schedule

__all__ = [
    "HEAD_STD", "ProgressiveUnfreezer", "WarmupSchedule", "capped_loss", "capped_per_sample_loss",
    "conv_clip", "freeze_parts", "init_new_head", "kaiming_like_std", "layer_groups",
    "pipeline_sampler", "sampler",
    "temperature_cross_entropy", "unet_lora", "unfreeze_schedule", "warmup_cosine",
    "warmup_cosine_factor", "warmup_linear", "warmup_linear_factor",
]
