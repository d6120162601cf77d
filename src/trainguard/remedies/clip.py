"""Global-norm clipping from an already measured norm: no second pass over the gradients.

Same arithmetic as `torch.nn.utils.clip_grad_norm_` (coefficient max_norm / (norm + 1e-6), capped
at 1), but the gradients are only touched when the coefficient is below 1.
"""

from __future__ import annotations

import math

import torch

EPS = 1e-6  # as in torch.nn.utils.clip_grad_norm_


def clip_coefficient(grad_norm: float, max_norm: float | None) -> float:
    """Factor to multiply gradients by; 1.0 when no clipping is needed or possible (non-finite)."""
    if max_norm is None or not math.isfinite(grad_norm):
        return 1.0
    return min(1.0, max_norm / (grad_norm + EPS))


def scale_grads(grads: list[torch.Tensor], coef: float) -> None:
    if grads and coef != 1.0:
        torch._foreach_mul_(grads, coef)
