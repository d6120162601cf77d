"""Skipping a step without touching optimizer state.

The optimizer's `step()` is simply not called, so Adam's moments and step count stay as they
were; gradients are dropped so that a NaN cannot leak into the next accumulation. (Multiplying a
NaN gradient by zero, as some "skip" implementations do, still yields NaN.)
"""

from __future__ import annotations

import torch


def drop_grads(params: list[torch.Tensor]) -> None:
    for param in params:
        param.grad = None
