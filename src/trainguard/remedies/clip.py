"""Global-norm clipping from an already measured norm: no second pass over the gradients.

Same arithmetic as `torch.nn.utils.clip_grad_norm_` (coefficient max_norm / (norm + 1e-6), capped
at 1), but the gradients are only touched when the coefficient is below 1.
"""

from __future__ import annotations

import math

import numpy as np
import torch

EPS = 1e-6  # as in torch.nn.utils.clip_grad_norm_
_F32_EPS = np.float32(EPS)
_F32_ONE = np.float32(1.0)


def clip_coefficient(grad_norm: float, max_norm: float | None) -> float:
    """Factor to multiply gradients by; 1.0 when no clipping is needed or possible (non-finite).

    Computed in float32 as `clip_grad_norm_` computes it for float32 gradients: its norm is a
    float32 tensor, and `max_norm / tensor` is `tensor.reciprocal() * max_norm` in PyTorch. So a
    fixed limit clips bit for bit as the loop without trainguard does."""
    if max_norm is None or not math.isfinite(grad_norm):
        return 1.0
    coef = (_F32_ONE / (np.float32(grad_norm) + _F32_EPS)) * np.float32(max_norm)
    return min(1.0, float(coef))


def scale_grads(grads: list[torch.Tensor], coef: float) -> None:
    if grads and coef != 1.0:
        torch._foreach_mul_(grads, coef)
