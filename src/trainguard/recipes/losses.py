"""Loss-side stabilisers from the guide: temperature-scaled cross-entropy and a loss cap.

Temperature. `cross_entropy(logits / T, target)` has gradient `(softmax(logits / T) - y) / T`
with respect to the logits: every gradient is scaled by 1/T, and the softmax it compares against
the target is softer, so a confidently wrong prediction no longer saturates it. T > 1 damps;
T < 1 (the guide's range goes down to 0.7) sharpens and amplifies gradients by 1/T. Under Adam(W),
which divides by a running gradient scale, the constant 1/T is largely normalised away after a few
steps; what remains is the softer softmax. The model learns logits about T times larger to fit the
same targets, so evaluate with the same temperature it was trained with.

Cap. `clamp(loss, max=cap)` is the guide's last line of defence when resuming a crashed run. Its
caveat: where the loss is above the cap the clamp's gradient is zero, so those samples teach the
model nothing and nothing says so. A zero gradient is also not a skipped step: Adam(W) still moves
the weights with its momentum and applies weight decay. Capping per sample confines that loss of
learning to the outlying samples; skipping the step entirely (trainguard's `protect` and
`recover` policies) leaves the weights and optimizer state untouched. A non-finite loss is passed
through unchanged so that it is detected, never clamped into a plausible number.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F

from trainguard.errors import ConfigError, UsageError

Reduction = Literal["mean", "sum", "none"]


def _positive_finite(value: object, name: str) -> float:
    # `not x > 0` also rejects NaN; the isfinite check rejects inf.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or \
            not math.isfinite(value):
        raise ConfigError(f"{name}: must be a finite number > 0, got {value!r}")
    return float(value)


def _tensor(value: object, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise UsageError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def temperature_cross_entropy(logits: torch.Tensor, target: torch.Tensor,
                              temperature: float = 2.0, **ce_kwargs: Any) -> torch.Tensor:
    """Cross-entropy of `logits / temperature`; classes are on the last dimension.

    As in the guide (and Hugging Face models), `logits` of shape (..., C) are flattened to
    (N, C) and `target` of shape (...) to (N,) (class indices), or to (N, C) when it holds class
    probabilities of the same shape as `logits`. `ce_kwargs` go to `F.cross_entropy`
    (ignore_index, reduction, label_smoothing, weight).
    """
    logits, target = _tensor(logits, "logits"), _tensor(target, "target")
    temperature = _positive_finite(temperature, "temperature")
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise UsageError(f"logits must have a class dimension last, got shape "
                         f"{tuple(logits.shape)}")
    classes = logits.shape[-1]
    if target.shape == logits.shape and target.is_floating_point():
        flat_target = target.reshape(-1, classes)
    elif target.shape == logits.shape[:-1]:
        flat_target = target.reshape(-1)
    else:
        raise UsageError(f"target shape {tuple(target.shape)} does not fit logits "
                         f"{tuple(logits.shape)}: expected class indices of shape "
                         f"{tuple(logits.shape[:-1])} or probabilities of shape "
                         f"{tuple(logits.shape)}")
    return F.cross_entropy(logits.reshape(-1, classes) / temperature, flat_target, **ce_kwargs)


def capped_loss(loss: torch.Tensor, cap: float) -> torch.Tensor:
    """`loss` clamped to at most `cap`, element-wise; NaN and ±inf are left as they are.

    Caveat (see the module docstring): a clamped element has zero gradient, so it silently stops
    contributing to learning.
    """
    loss = _tensor(loss, "loss")
    cap = _positive_finite(cap, "cap")
    # where() instead of clamp alone: clamp would turn +inf into `cap` and hide it.
    return torch.where(torch.isfinite(loss), loss.clamp(max=cap), loss)


def capped_per_sample_loss(losses: torch.Tensor, cap: float,
                           reduction: Reduction = "mean") -> torch.Tensor:
    """Cap each sample's loss (e.g. from `reduction="none"`) at `cap`, then reduce.

    Only the samples above the cap lose their gradient; the rest of the batch keeps learning,
    where capping the batch mean would silence the whole batch. The mean is over all samples
    (capped ones count as the constant `cap`). `(losses > cap).sum()` says how many were capped.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ConfigError(f"reduction: must be 'mean', 'sum' or 'none', got {reduction!r}")
    capped = capped_loss(losses, cap)
    if reduction == "mean":
        return capped.mean()
    return capped.sum() if reduction == "sum" else capped
