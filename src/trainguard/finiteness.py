"""Whether a model's weights and an optimizer's moments are all finite, checked on the device.

One `torch._foreach_norm` per device and dtype, summed, and one host transfer for both: cheap
enough for a checkpoint and for the run's end, never per step. A checkpoint's sidecar and the
run's verdict both rest on it: a NaN in the weights outranks whatever the losses said.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from trainguard.errors import UsageError
from trainguard.probes.norms import dense_values
from trainguard.transfer import to_host


def _norm_sum(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The sum of the tensors' 2-norms as one float32 value on `device`: NaN or inf when any
    value is. `torch._foreach_norm` per device and dtype (half precision accumulated in float32),
    no copy of the tensors."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    sums = [torch.stack(torch._foreach_norm(group, 2, dtype=torch.float32)).sum().to(device)
            for group in groups.values()]
    return torch.stack(sums).sum() if sums else torch.zeros((), device=device)


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    """Value by value: whether every value of every tensor is finite."""
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _floats(tensors: Iterable[Any]) -> list[torch.Tensor]:
    found = []
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 0:
            local = t.to_local() if hasattr(t, "to_local") else t  # a DTensor's own shard
            found.append(dense_values(local.detach()))  # a sparse momentum: its values
    return found


def finite_state(params: Iterable[torch.Tensor],
                 optimizer: torch.optim.Optimizer | None) -> tuple[bool, bool | None]:
    """Whether every weight, and every optimizer moment, is finite: checked on the device, one
    host transfer for both. The optimizer's is None when it holds no floating state."""
    weights = _floats(params)
    moments = _floats(v for state in (optimizer.state.values() if optimizer is not None else ())
                      for v in state.values())
    if not weights:
        raise UsageError("the model has no floating-point weights to check")
    device = weights[0].device
    sums = [_norm_sum(weights, device)] + ([_norm_sum(moments, device)] if moments else [])
    host = to_host(torch.stack(sums))
    finite = [bool(v == v and abs(v) != float("inf")) for v in host.tolist()]
    # a 2-norm overflows beyond about 1e19 (float32): a non-finite sum is confirmed value by
    # value, so huge finite values are not called non-finite (rare: only when the sum is)
    for index, group in enumerate((weights, moments)[:len(finite)]):
        if not finite[index]:
            finite[index] = _all_finite(group)
    return finite[0], (finite[1] if moments else None)
