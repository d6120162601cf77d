"""The parts of a diffusion model, found by what they are rather than what they are called.

A latent diffusion model holds a denoiser (the UNet, or a diffusion transformer) beside parts
trained once and then kept fixed: the autoencoder that maps images to latents (a VAE, a VQ
model) and the text encoder of its prompts. Their attribute names vary with the code base
(`vae`, `first_stage_model`, `cond_stage_model`, `text_encoder`), their roles do not:

- a denoiser's forward takes the diffusion timestep (`timestep` or `timesteps`);
- an autoencoder has `encode` and `decode`;
- a text encoder is a transformers model whose input embedding is a token table.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Literal

from torch import nn

TIMESTEP_ARGUMENTS = frozenset({"timestep", "timesteps"})

Role = Literal["autoencoder", "text_encoder"]


@dataclass(frozen=True)
class Part:
    name: str
    """Dotted path of the part in the model."""
    role: Role
    module: nn.Module


def takes_timestep(module: nn.Module) -> bool:
    """Whether the module's forward takes a diffusion timestep by name."""
    try:
        parameters = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):  # a builtin or C-implemented forward
        return False
    return not TIMESTEP_ARGUMENTS.isdisjoint(parameters)


def is_autoencoder(module: nn.Module) -> bool:
    return callable(getattr(module, "encode", None)) and callable(getattr(module, "decode", None))


def is_text_encoder(module: nn.Module) -> bool:
    """A transformers model (any `PreTrainedModel`) whose inputs are token ids."""
    if not any(cls.__name__ == "PreTrainedModel" for cls in type(module).__mro__):
        return False
    get_embeddings = getattr(module, "get_input_embeddings", None)
    try:
        embeddings = get_embeddings() if callable(get_embeddings) else None
    except NotImplementedError:
        return False
    return isinstance(embeddings, nn.Embedding)


def _role(module: nn.Module) -> Role | None:
    if is_autoencoder(module):
        return "autoencoder"
    if is_text_encoder(module):
        return "text_encoder"
    return None


def denoisers(model: nn.Module) -> list[str]:
    """Dotted paths of the outermost submodules that take a timestep (the model itself: "")."""
    found: list[str] = []
    for name, module in model.named_modules():
        if any(_within(name, outer) for outer in found):
            continue
        if takes_timestep(module):
            found.append(name)
    return found


def _within(name: str, outer: str) -> bool:
    return outer == "" or name == outer or name.startswith(outer + ".")


def fixed_parts(model: nn.Module) -> list[Part]:
    """The autoencoders and text encoders held beside a denoiser, outermost first: the parts a
    diffusion fine-tune keeps frozen. None when the model holds no denoiser, or when it is the
    denoiser itself (a VAE or text encoder trained on its own is the run's subject)."""
    inner = denoisers(model)
    if not inner or "" in inner:
        return []
    parts: list[Part] = []
    for name, module in model.named_modules():
        if not name or any(_within(name, p.name) for p in parts):
            continue
        if any(_within(name, d) or _within(d, name) for d in inner):
            continue  # the denoiser, a part of it, or a module that holds it
        role = _role(module)
        if role is not None:
            parts.append(Part(name, role, module))
    return parts
