"""Fused L2 norms accumulated in float32, for gradients, weights and optimizer state alike."""

from __future__ import annotations

import torch


def dense_values(tensor: torch.Tensor) -> torch.Tensor:
    """A sparse tensor's values, its duplicate indices summed (its other elements are zeros:
    the same norm, the same NaN); a dense one as it is."""
    return tensor.coalesce()._values() if tensor.is_sparse else tensor


def float32_norms(tensors: list[torch.Tensor], *,
                  sparse: bool | None = None) -> list[torch.Tensor]:
    """One float32 L2 norm per tensor with `torch._foreach_norm`.

    A fused norm cannot narrow its input, so float64 tensors (rare, but a float64 model must be
    guarded too) are normed in their own precision and converted after. Nor does it take a
    sparse tensor (`nn.Embedding(sparse=True)`'s gradient, SGD's momentum for it): `sparse`
    True norms each by its values (`dense_values`, a coalesce: a sort of its indices); None
    does so when the fused norm refuses a list holding one; False never does."""
    if sparse:
        tensors = [dense_values(t) for t in tensors]
    elif sparse is None:
        try:
            return float32_norms(tensors, sparse=False)
        except RuntimeError:  # NotImplementedError included
            if not any(t.is_sparse for t in tensors):
                raise
            return float32_norms(tensors, sparse=True)
    if not any(t.dtype == torch.float64 for t in tensors):
        return list(torch._foreach_norm(tensors, 2, dtype=torch.float32))
    norms: list[torch.Tensor | None] = [None] * len(tensors)
    double = [i for i, t in enumerate(tensors) if t.dtype == torch.float64]
    other = [i for i, t in enumerate(tensors) if t.dtype != torch.float64]
    if other:
        for i, n in zip(other, torch._foreach_norm([tensors[i] for i in other], 2,
                                                    dtype=torch.float32), strict=True):
            norms[i] = n
    for i, n in zip(double, torch._foreach_norm([tensors[i] for i in double], 2), strict=True):
        norms[i] = n.float()
    return norms  # type: ignore[return-value]
