"""The guide's remedies for diffusion fine-tuning (§5.2): freeze the VAE and the text encoder,
clip the UNet's convolutions, train the UNet through LoRA.

- `freeze_parts`: every autoencoder and text encoder beside the denoiser (found by what it is,
  `diagnose.model_parts`) frozen, put in eval mode, and taken out of the optimizer if one is
  given. A moving autoencoder shifts the latents the UNet learned to denoise.
- `conv_clip`: a clip rule that holds the gradient norm of each convolution of a model (found by
  type) to a limit, leaving the other layers alone; hand it to `GuardConfig(clip_rule=...)`.
- `unet_lora`: LoRA adapters on a UNet's attention projections and convolutions with PEFT, the
  base weights frozen; the UNet stays the same module (PEFT's `inject_adapter_in_model`, or
  diffusers' own `add_adapter` where the model has it).
- `sampler`: a `sample_fn` for the Guard (`Guard(..., sample_fn=...)`): a few denoising steps
  of an unconditional UNet from a fixed seed, with a copy of the training's noise scheduler;
  `pipeline_sampler`: the same from a diffusers pipeline that holds the trained model.
"""

from __future__ import annotations

import glob
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from trainguard.diagnose.model_parts import fixed_parts
from trainguard.errors import ConfigError, UsageError
from trainguard.remedies.layerwise import LayerwiseClip
from trainguard.remedies.rules import check_limit

LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "conv1", "conv2")
"""Diffusers' attention projections and the resnet blocks' convolutions: the layers the
diffusers LoRA training scripts adapt."""
CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d)


def freeze_parts(model: nn.Module, optimizer: torch.optim.Optimizer | None = None
                 ) -> list[str]:
    """Freeze the autoencoders and text encoders held beside `model`'s denoiser and, if
    `optimizer` is given, remove their parameters from its param groups (with any state it
    keeps for them). Returns the frozen parts' names; none when the model holds no denoiser
    beside such a part."""
    parts = fixed_parts(model)
    frozen: set[int] = set()
    for part in parts:
        part.module.requires_grad_(False)
        part.module.eval()
        frozen.update(id(p) for p in part.module.parameters())
    if optimizer is not None and frozen:
        for group in optimizer.param_groups:
            kept = [p for p in group["params"] if id(p) not in frozen]
            for p in group["params"]:
                if id(p) in frozen:
                    optimizer.state.pop(p, None)
            group["params"] = kept
    return [part.name for part in parts]


def conv_clip(model: nn.Module, max_norm: float = 1.0, *, per_parameter: bool = True
              ) -> LayerwiseClip:
    """A clip rule holding every convolution's gradient to `max_norm`: each weight and bias on
    its own with `per_parameter` (the default), else all of them jointly. Only the
    convolutions' trainable parameters are named; the rest of the model is left alone."""
    limit = check_limit(max_norm, "conv_clip.max_norm")
    names = [f"{module_name}.{name}" if module_name else name
             for module_name, module in model.named_modules() if isinstance(module, CONV_TYPES)
             for name, p in module.named_parameters(recurse=False) if p.requires_grad]
    if not names:
        raise UsageError(f"{type(model).__name__} has no trainable convolution to clip")
    # the names as fnmatch patterns that match themselves only
    return LayerwiseClip({glob.escape(n): limit for n in names}, per_parameter=per_parameter)


def unet_lora(unet: nn.Module, r: int = 4, alpha: int | None = None,
              target_modules: Sequence[str] = LORA_TARGETS, **config: Any) -> nn.Module:
    """Freeze `unet` and add LoRA adapters of rank `r` (alpha = r unless given: a scaling of 1)
    to the `target_modules` it has, as the diffusers LoRA scripts do. Returns the UNet (the
    same module, adapted in place). Needs `peft`."""
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as exc:  # an optional dependency
        raise UsageError("unet_lora needs peft: pip install peft") from exc
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ConfigError(f"unet_lora.r: must be an integer >= 1, got {r!r}")
    names = [name for name, _ in unet.named_modules()]
    targets = [t for t in target_modules if any(n == t or n.endswith("." + t) for n in names)]
    if not targets:
        raise UsageError(f"{type(unet).__name__} has none of the LoRA targets "
                         f"{list(target_modules)}")
    lora = LoraConfig(r=r, lora_alpha=r if alpha is None else alpha,
                      init_lora_weights="gaussian", target_modules=targets, **config)
    unet.requires_grad_(False)
    add_adapter = getattr(unet, "add_adapter", None)
    if callable(add_adapter):
        add_adapter(lora)
    else:
        unet = inject_adapter_in_model(lora, unet)
    return unet


def sampler(scheduler: Any, *, images: int = 4, steps: int = 10, seed: int = 0,
            size: int | None = None, channels: int | None = None
            ) -> Callable[[nn.Module], torch.Tensor]:
    """A `sample_fn` for `Guard(..., sample_fn=...)`: `images` samples of an unconditional UNet
    (`unet(x, t).sample`) in `steps` denoising steps from the seed `seed` (the same noise at
    every call, so the samples differ only by what the model learned), with a copy of the
    diffusers noise `scheduler` the training uses (its own timesteps are left alone). Size and
    channels default to the UNet's config. Returns images clamped to [-1, 1]."""
    infer = type(scheduler).from_config(scheduler.config)

    def sample(model: nn.Module) -> torch.Tensor:
        config = getattr(model, "config", None)
        side = size or getattr(config, "sample_size", None)
        depth = channels or getattr(config, "in_channels", None)
        if not isinstance(side, int) or not isinstance(depth, int):
            raise UsageError("sampler needs size= and channels= for a model without a diffusers "
                             "config (sample_size, in_channels)")
        device = next(model.parameters()).device
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(images, depth, side, side, generator=generator).to(device)
        infer.set_timesteps(steps)
        for t in infer.timesteps:
            out = model(x, t).sample
            x = infer.step(out, t, x, generator=generator).prev_sample
        return x.clamp(-1, 1)

    return sample


def pipeline_sampler(pipeline: Any, *, images: int = 4, steps: int = 10, seed: int = 0,
                     **call: Any) -> Callable[[nn.Module], torch.Tensor]:
    """A `sample_fn` from a diffusers pipeline that holds the model being trained (as its
    `unet` or `transformer`): `images` samples in `steps` inference steps from the seed `seed`,
    `call` passed on (a `prompt=` for text-to-image). The pipeline is called through a copy
    with its own copy of the scheduler (a pipeline call sets its scheduler's timesteps, which
    the training's scheduler keeps) and its progress bar off; its modules are the same.
    Returns the pipeline's images as a tensor (N x C x H x W in [0, 1])."""
    import inspect

    components = dict(getattr(pipeline, "components", {}) or {})
    if not components:
        raise UsageError(f"pipeline_sampler needs a diffusers pipeline, got "
                         f"{type(pipeline).__name__}")
    if components.get("scheduler") is not None:
        scheduler = components["scheduler"]
        components["scheduler"] = type(scheduler).from_config(scheduler.config)
    own = type(pipeline)(**components)
    own.set_progress_bar_config(disable=True)
    accepted = inspect.signature(own.__call__).parameters
    count = ("batch_size" if "batch_size" in accepted
             else "num_images_per_prompt" if "num_images_per_prompt" in accepted else None)

    def sample(model: nn.Module) -> torch.Tensor:
        first = next(model.parameters(), None)
        if not any(isinstance(part, nn.Module) and first is not None
                   and any(p is first for p in part.parameters())
                   for part in own.components.values()):
            raise UsageError("the pipeline given to pipeline_sampler does not hold the model "
                             "being trained: build it from that model (unet=...)")
        generator = torch.Generator().manual_seed(seed)
        options = {"num_inference_steps": steps, "generator": generator, "output_type": "pt",
                   "return_dict": False, **call}
        if count is not None:
            options[count] = images
        out = own(**options)[0]
        return out if isinstance(out, torch.Tensor) else torch.as_tensor(out)

    return sample
