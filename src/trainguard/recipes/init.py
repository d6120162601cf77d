"""Initialisation of newly added heads: normal(0, 0.02) weights and zero biases.

The guide's advice for stubborn explosions is to initialise the last classification layer by hand
with std 0.02, and Kaiming initialisation for other new layers. A head initialised at PyTorch's
default scale (about 1/sqrt(3 * fan_in)) or larger starts with large logits on a pre-trained
backbone's features: the first losses are high and their gradients flow straight into the
backbone. 0.02 (the scale transformers use) is below Kaiming's sqrt(2 / fan_in) for any fan_in
under 5000, so the head starts close to uniform predictions. `kaiming_like_std` gives that
reference scale for comparison.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from trainguard.errors import ConfigError, UsageError

HEAD_STD = 0.02


def init_new_head(module: nn.Module, std: float = HEAD_STD, zero_bias: bool = True) -> list[str]:
    """Re-initialise every `nn.Linear` in `module` (or `module` itself) with normal(0, std).

    Biases are zeroed when `zero_bias`; other layers (norms, embeddings) are left as they are.
    Returns the names of the re-initialised layers relative to `module` ("" for itself).
    """
    if not isinstance(module, nn.Module):
        raise UsageError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    # `not std > 0` rejects NaN as well as zero and negative values.
    if isinstance(std, bool) or not isinstance(std, (int, float)) or not std > 0 or \
            not math.isfinite(std):
        raise ConfigError(f"std: must be a finite number > 0, got {std!r}")
    linears = [(name, m) for name, m in module.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise UsageError(f"{type(module).__name__} contains no nn.Linear layer to initialise")
    with torch.no_grad():
        for _, linear in linears:
            nn.init.normal_(linear.weight, mean=0.0, std=std)
            if zero_bias and linear.bias is not None:
                linear.bias.zero_()
    return [name for name, _ in linears]


def kaiming_like_std(weight: torch.Tensor, nonlinearity: str = "relu") -> float:
    """Std of Kaiming (He) normal init for `weight`: gain / sqrt(fan_in).

    fan_in is the size of one output row (in_features for Linear, in_channels x kernel for conv).
    `nonlinearity` is as in `torch.nn.init.calculate_gain`: "relu" gives sqrt(2 / fan_in),
    "linear" the LeCun scale 1 / sqrt(fan_in).
    """
    if not isinstance(weight, torch.Tensor) or weight.dim() < 2:
        raise UsageError("weight must be a torch.Tensor with at least 2 dimensions (out, in, ...)")
    try:
        gain = nn.init.calculate_gain(nonlinearity)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConfigError(f"nonlinearity: {exc}") from None
    fan_in = weight[0].numel()
    return gain / math.sqrt(fan_in)
