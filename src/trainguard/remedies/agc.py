"""Adaptive Gradient Clipping (AGC, Brock et al. 2021, "High-Performance Large-Scale Image
Recognition Without Normalization", the NFNets paper).

A gradient is clipped relative to the weight it updates: for each unit i (a row of a >= 2-D
weight, i.e. one output unit in PyTorch's (out, in, ...) layout; the whole tensor for a 1-D or
0-D parameter)

    if ||g_i|| / max(||w_i||, eps) > clipping:
        g_i <- g_i * clipping * max(||w_i||, eps) / ||g_i||

so no unit's gradient exceeds a `clipping` fraction of the unit's own norm, whatever the
gradient's absolute scale. `eps` keeps zero-initialised weights (biases) from freezing.

The paper leaves the final linear (classifier) layer unclipped, having found that clipping it
hurts; add its name to `exclude` (e.g. "classifier.*", "lm_head.*", "fc.*"). The default also
excludes biases and normalisation parameters, unlike the paper (whose NFNets have no
normalisation layers): a bias that starts at zero would be held to clipping * eps, and a norm
gain's size says little about how far its update may safely go.

Note on layouts: `transformers`' Conv1D (GPT-2) stores weights as (in, out), so its "rows" are
input units; the clipping is still per unit, only along the other axis.

AGC needs the weight norms, which live on the device: it runs there with torch ops only and never
reads anything back to the host (no sync). Non-finite gradients take the untouched branch: the
Guard skips such steps instead of clipping them.
"""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Any

import numpy as np
import torch

from trainguard.errors import ConfigError, UsageError
from trainguard.remedies.rules import check_limit

DEFAULT_EXCLUDE: tuple[str, ...] = ("*bias", "*norm*", "*Norm*", "*ln_*")
"""Biases and normalisation parameters (LayerNorm, RMSNorm, BatchNorm; GPT-2's ln_1/ln_2/ln_f)."""

_Key = tuple[torch.device, torch.dtype, torch.dtype]


def _norm_dtype(tensor: torch.Tensor) -> torch.dtype:
    """At least float32, so half-precision norms neither overflow nor lose precision."""
    return torch.promote_types(tensor.dtype, torch.float32)


def unit_norms(tensor: torch.Tensor) -> torch.Tensor:
    """L2 norm of each unit, shaped to broadcast against `tensor` (keepdim)."""
    dims = tuple(range(1, tensor.ndim)) if tensor.ndim >= 2 else None
    return torch.linalg.vector_norm(tensor, 2, dim=dims, keepdim=True, dtype=_norm_dtype(tensor))


class AGC:
    def __init__(self, clipping: float = 0.01, eps: float = 1e-3, *, unitwise: bool = True,
                 exclude: Sequence[str] = DEFAULT_EXCLUDE) -> None:
        self.clipping = check_limit(clipping, "AGC.clipping")
        self.eps = check_limit(eps, "AGC.eps")
        if not isinstance(unitwise, bool):
            raise ConfigError(f"AGC.unitwise: must be True or False, got {unitwise!r}")
        if isinstance(exclude, str) or not all(isinstance(p, str) and p for p in exclude):
            raise ConfigError(f"AGC.exclude: must be a sequence of non-empty name patterns "
                              f"(e.g. ('*bias', 'lm_head.*')), got {exclude!r}")
        self.unitwise = unitwise
        self.exclude = tuple(exclude)
        self._names_key: tuple[str, ...] | None = None
        self._included = np.zeros(0, dtype=bool)

    def included(self, names: Sequence[str]) -> np.ndarray:
        """Which parameters AGC clips (not excluded by name); cached for the last names list."""
        key = tuple(names)  # compared by content: a list edited in place is not served stale
        if key != self._names_key:
            self._included = np.array(
                [not any(fnmatchcase(n, p) for p in self.exclude) for n in key], dtype=bool)
            self._names_key = key
        return self._included

    def apply(self, params: Sequence[torch.Tensor], names: Sequence[str],
              grad_norms: np.ndarray | torch.Tensor | None = None) -> None:
        """Clip the gradients of `params` in place, on their device, without a host sync.

        `grad_norms` (one L2 norm per parameter, e.g. the norms the Guard measured) spares the
        parameter-wise variant its gradient-norm pass; pass it only if nothing rescaled the
        gradients since they were measured. The unit-wise variant needs per-row norms and
        ignores it.
        """
        if len(params) != len(names):
            raise UsageError(f"AGC.apply: got {len(params)} parameters but {len(names)} names")
        if grad_norms is not None and len(grad_norms) != len(params):
            raise UsageError(f"AGC.apply: got {len(grad_norms)} gradient norms for "
                             f"{len(params)} parameters")
        groups: dict[_Key, list[int]] = {}
        for i in np.flatnonzero(self.included(names)).tolist():
            grad = params[i].grad
            if grad is None or grad.is_sparse:
                continue
            groups.setdefault((grad.device, params[i].dtype, grad.dtype), []).append(int(i))
        with torch.no_grad():
            for (device, _, _), index in groups.items():
                weights = [params[i].detach() for i in index]
                grads = [g for i in index if (g := params[i].grad) is not None]
                if self.unitwise:
                    self._clip_units(weights, grads)
                else:
                    given = None if grad_norms is None else _select(grad_norms, index, device)
                    self._clip_tensors(weights, grads, given)

    def _scale(self, weight_norms: torch.Tensor, grad_norms: torch.Tensor) -> torch.Tensor:
        max_norms = weight_norms.clamp_min(self.eps) * self.clipping
        # NaN/Inf gradient norms compare False or are masked: the untouched branch
        clip = torch.isfinite(grad_norms) & (grad_norms > max_norms)
        return torch.where(clip, max_norms / grad_norms, torch.ones_like(grad_norms))

    def _clip_units(self, weights: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        # row norms differ in shape per tensor: flatten them into one vector so that the ratio
        # and the decision are a handful of kernels for the whole group, not a few per tensor
        w_units = [unit_norms(w) for w in weights]
        g_units = [unit_norms(g) for g in grads]
        scale = self._scale(torch.cat([u.reshape(-1) for u in w_units]),
                            torch.cat([u.reshape(-1) for u in g_units]).to(w_units[0].dtype))
        scale = scale.to(grads[0].dtype)
        pieces = torch.split(scale, [u.numel() for u in w_units])
        torch._foreach_mul_(grads, [p.view(u.shape) for p, u in zip(pieces, w_units, strict=True)])

    def _clip_tensors(self, weights: list[torch.Tensor], grads: list[torch.Tensor],
                      grad_norms: torch.Tensor | None) -> None:
        w_norms = torch.stack(torch._foreach_norm(weights, 2, dtype=_norm_dtype(weights[0])))
        if grad_norms is None:
            grad_norms = torch.stack(torch._foreach_norm(grads, 2, dtype=_norm_dtype(grads[0])))
        scale = self._scale(w_norms, grad_norms.to(w_norms.dtype)).to(grads[0].dtype)
        torch._foreach_mul_(grads, list(scale.unbind()))

    def spec(self) -> dict[str, Any]:
        return {"type": "agc", "clipping": self.clipping, "eps": self.eps,
                "unitwise": self.unitwise, "exclude": list(self.exclude)}

    def describe(self) -> str:
        scope = "unit-wise" if self.unitwise else "parameter-wise"
        skip = f", excluding {', '.join(self.exclude)}" if self.exclude else ""
        return f"AGC ({scope}, clipping {self.clipping:g}, eps {self.eps:g}{skip})"

    def __repr__(self) -> str:
        return (f"AGC(clipping={self.clipping!r}, eps={self.eps!r}, unitwise={self.unitwise}, "
                f"exclude={self.exclude!r})")


def _select(norms: np.ndarray | torch.Tensor, index: list[int],
            device: torch.device) -> torch.Tensor:
    """The norms of `index` on `device`; host-to-device copies are non-blocking (no sync)."""
    if isinstance(norms, torch.Tensor):
        if len(index) == norms.shape[0]:
            return norms.to(device, non_blocking=True)
        positions = torch.tensor(index).to(norms.device, non_blocking=True)
        return norms.index_select(0, positions).to(device, non_blocking=True)
    host = np.ascontiguousarray(np.asarray(norms, dtype=np.float32)[index])
    return torch.from_numpy(host).to(device, non_blocking=True)
