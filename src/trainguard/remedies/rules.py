"""Clipping rules: per-parameter multipliers computed on the host from already measured norms.

The Guard measures the pre-clip L2 norm of every watched gradient once per step and brings it to
the host with the step's single transfer. A `ClipRule` turns those norms into one multiplier per
parameter (1.0 = untouched) without touching the gradients, so clipping costs no second pass over
them and no host sync; `apply_coefficients` then scales the gradients with grouped fused ops.

Rules compose like optax transformations: `chain(a, b)` (in `spec.py`, since a chain is built
from specs and stored as one) runs `a`, then shows `b` the norms as `a` left them, and multiplies
the coefficients.

Non-finite norms never produce a coefficient below 1: a step with a NaN/Inf gradient is skipped
by the Guard, not clipped (multiplying a NaN by any factor still yields NaN).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from trainguard.errors import ConfigError, UsageError

EPS = 1e-6  # as in torch.nn.utils.clip_grad_norm_
_F32_ONE = np.float32(1.0)
_F32_EPS = np.float32(EPS)


@runtime_checkable
class ClipRule(Protocol):
    """Turns per-parameter gradient norms into per-parameter multipliers in [0, 1].

    A rule that goes in a `GuardConfig` also needs `spec()`, its description as plain data
    (see `trainguard.remedies.spec`); a rule used only directly does not."""

    def coefficients(self, norms: np.ndarray, global_norm: float,
                     names: Sequence[str]) -> np.ndarray:
        """One multiplier per parameter (float64, 1.0 = untouched), from the norms only."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def describe(self) -> str: ...


class StatelessRule:
    """Base for rules that keep nothing between steps: their state is empty."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise UsageError(f"{type(self).__name__} keeps no state, got keys {sorted(state)}")


def check_limit(value: Any, name: str) -> float:
    """A clipping limit: a finite number > 0 (a bool is refused, it is never meant as 1.0)."""
    if (not isinstance(value, (int, float, np.floating, np.integer)) or isinstance(value, bool)
            or not math.isfinite(float(value)) or float(value) <= 0):
        raise ConfigError(f"{name}: must be a finite number > 0, got {value!r}")
    return float(value)


def check_norms(norms: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """The measured norms as a 1-D float array with one entry per name."""
    array = np.asarray(norms)
    if array.ndim != 1 or array.shape[0] != len(names):
        raise UsageError(f"clip rule: expected one gradient norm per parameter ({len(names)} "
                         f"names), got an array of shape {array.shape}")
    return array


def clip_factor(norm: float, max_norm: float) -> float:
    """min(1, max_norm / (norm + 1e-6)) with torch.nn.utils.clip_grad_norm_'s float32 arithmetic.

    torch computes `max_norm / (total_norm + 1e-6)` on a float32 tensor, which it evaluates as
    `reciprocal(total_norm + 1e-6) * max_norm`; doing the same here makes the clipped gradients
    equal to clip_grad_norm_'s bit for bit. Non-finite norms give 1.0 (the step is skipped).
    """
    if not math.isfinite(norm):
        return 1.0
    coef = (_F32_ONE / (np.float32(norm) + _F32_EPS)) * np.float32(max_norm)
    return float(coef) if coef < _F32_ONE else 1.0


def clip_factors(norms: np.ndarray, max_norms: np.ndarray) -> np.ndarray:
    """`clip_factor` element-wise: one coefficient per norm (float64 holding float32 values)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        norms32 = np.asarray(norms).astype(np.float32)
        coefs = (_F32_ONE / (norms32 + _F32_EPS)) * np.asarray(max_norms, dtype=np.float32)
    # written so that NaN (from a NaN norm) takes the untouched branch
    return np.where(np.isfinite(norms32) & (coefs < _F32_ONE), coefs, _F32_ONE).astype(np.float64)


def group_norms(norms: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """sqrt of the sum of squared member norms of each group (float64; NaN/Inf propagate)."""
    squares = np.square(norms.astype(np.float64))
    with np.errstate(invalid="ignore", over="ignore"):
        return np.sqrt(np.bincount(groups, weights=squares, minlength=n_groups))


class GlobalNormClip(StatelessRule):
    """Scale every gradient so the global norm is at most `max_norm` (clip_grad_norm_'s rule)."""

    def __init__(self, max_norm: float) -> None:
        self.max_norm = check_limit(max_norm, "GlobalNormClip.max_norm")

    def coefficients(self, norms: np.ndarray, global_norm: float,
                     names: Sequence[str]) -> np.ndarray:
        norms = check_norms(norms, names)
        return np.full(norms.shape[0], clip_factor(float(global_norm), self.max_norm))

    def spec(self) -> dict[str, Any]:
        return {"type": "global_norm", "max_norm": self.max_norm}

    def describe(self) -> str:
        return f"global norm <= {self.max_norm:g}"


def apply_coefficients(params: Sequence[torch.Tensor], coefs: np.ndarray) -> int:
    """Multiply the `.grad` of each parameter whose coefficient is below 1; return how many.

    Gradients are grouped by (device, dtype) and scaled with one fused `_foreach_mul_` per group;
    nothing is read back from the device. A NaN coefficient takes the safe branch (untouched).
    """
    coefs = np.asarray(coefs, dtype=np.float64)
    if coefs.ndim != 1 or coefs.shape[0] != len(params):
        raise UsageError(f"apply_coefficients: expected one coefficient per parameter "
                         f"({len(params)}), got an array of shape {coefs.shape}")
    groups: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], list[float]]] = {}
    scaled = 0
    for i in np.flatnonzero(coefs < 1.0).tolist():
        grad = params[i].grad
        if grad is None:
            continue
        coef = float(coefs[i])
        scaled += 1
        if grad.is_sparse:  # foreach ops do not take sparse tensors
            with torch.no_grad():
                grad.mul_(coef)
            continue
        grads, values = groups.setdefault((grad.device, grad.dtype), ([], []))
        grads.append(grad)
        values.append(coef)
    with torch.no_grad():
        for grads, values in groups.values():
            torch._foreach_mul_(grads, values)
    return scaled
