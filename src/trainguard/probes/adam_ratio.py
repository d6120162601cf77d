"""Adam's second moment lagging the gradient, measured every step from the optimizer state.

Metric key (per watched parameter, every step): `adam_ratio_rms`, the root mean square over the
parameter's elements of g / sqrt(v_hat), where g is the step's gradient (final and unscaled,
before the optimizer step) and v_hat = (v + eps^2) / (1 - beta2^t) is Adam's bias-corrected
second moment from the steps before (`exp_avg_sq` after t updates). On a steady run it stays
near 1; it rises when the gradient grows faster than Adam's running average of it (an LR past
what the weights can take, a parameter whose v decayed while it got no gradient, an eps too
small for a v near 0), which tends to come some steps before the loss moves (Wortsman et al.
2023, arXiv 2304.13013). A parameter without a gradient or without Adam state yet reads 0.

Cost: four fused passes over the gradients and `exp_avg_sq` (g*g, v + eps^2, the division, an
L1 norm per tensor), in chunks of at most `CHUNK_ELEMENTS` elements so that the temporaries stay
small; the per-tensor bias corrections are computed with one small tensor operation. Nothing is
read on the host: the values ride the step's one transfer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trainguard.params import WatchedParams
from trainguard.probes.local import local_tensor

CHUNK_ELEMENTS = 1 << 24
"""At most this many elements per fused pass (a larger single tensor is its own chunk)."""


@dataclass
class _Rows:
    index: list[int] = field(default_factory=list)
    grads: list[torch.Tensor] = field(default_factory=list)
    moments: list[torch.Tensor] = field(default_factory=list)
    steps: list[torch.Tensor | float] = field(default_factory=list)
    beta2: list[float] = field(default_factory=list)
    eps2: list[float] = field(default_factory=list)


def _adam_group(group: dict) -> tuple[float, float] | None:
    """(beta2, eps) of an Adam-family parameter group; None for any other optimizer."""
    betas, eps = group.get("betas"), group.get("eps")
    if not isinstance(betas, (tuple, list)) or len(betas) < 2:
        return None
    beta2 = betas[1]
    if not isinstance(beta2, (int, float)) or not isinstance(eps, (int, float)):
        return None  # a tensor beta (capturable variants) would need a host read: left out
    return float(beta2), float(eps)


class AdamRatioProbe:
    def __init__(self, watched: WatchedParams, optimizers: list[torch.optim.Optimizer]) -> None:
        self.watched = watched
        self.optimizers = optimizers

    def _rows(self) -> _Rows:
        index = {id(p): i for i, p in enumerate(self.watched.params)}
        rows = _Rows()
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                adam = _adam_group(group)
                if adam is None:
                    continue
                for p in group["params"]:
                    i, state = index.get(id(p)), optimizer.state.get(p)
                    if i is None or p.grad is None or not state:
                        continue
                    v, step = state.get("exp_avg_sq"), state.get("step")
                    if (not isinstance(v, torch.Tensor) or v.shape != p.shape
                            or step is None or p.grad.shape != p.shape):
                        continue
                    rows.index.append(i)
                    rows.grads.append(local_tensor(p.grad))
                    rows.moments.append(local_tensor(v))
                    rows.steps.append(step)
                    rows.beta2.append(adam[0])
                    rows.eps2.append(adam[1] ** 2)
        return rows

    @torch.no_grad()
    def measure(self, device: torch.device) -> dict[str, torch.Tensor]:
        rows = self._rows()
        full = torch.zeros(len(self.watched), dtype=torch.float32, device=device)
        if not rows.index:
            return {"adam_ratio_rms": full}
        sums = torch.cat([_chunk_sums(rows.grads[a:b], rows.moments[a:b], rows.eps2[a:b], device)
                          for a, b in _chunks(rows.grads)])
        corrected = sums * _corrections(rows, device)
        full[torch.tensor(rows.index, device=device)] = corrected.sqrt()
        return {"adam_ratio_rms": full}


def _chunks(tensors: list[torch.Tensor]) -> list[tuple[int, int]]:
    spans, start, size = [], 0, 0
    for i, t in enumerate(tensors):
        if size and size + t.numel() > CHUNK_ELEMENTS:
            spans.append((start, i))
            start, size = i, 0
        size += t.numel()
    spans.append((start, len(tensors)))
    return spans


def _chunk_sums(grads: list[torch.Tensor], moments: list[torch.Tensor], eps2: list[float],
                device: torch.device) -> torch.Tensor:
    """sum(g^2 / (v + eps^2)) of each tensor, in float32 (half-precision ones widened)."""
    grads = [g.float() if g.dtype in (torch.float16, torch.bfloat16) else g for g in grads]
    moments = [v.float() if v.dtype in (torch.float16, torch.bfloat16) else v for v in moments]
    squares = torch._foreach_mul(grads, grads)
    torch._foreach_div_(squares, torch._foreach_add(moments, eps2))
    return torch.stack([n.to(device=device, dtype=torch.float32)
                        for n in torch._foreach_norm(squares, 1)])


def _corrections(rows: _Rows, device: torch.device) -> torch.Tensor:
    """(1 - beta2^t) / numel per row: the bias correction of v and the mean, without reading
    the step counts on the host (they are CPU tensors for most optimizers: one small copy)."""
    steps = rows.steps
    on_cpu = all(not isinstance(s, torch.Tensor) or s.device.type == "cpu" for s in steps)
    where = torch.device("cpu") if on_cpu else device
    count = torch.stack([s.detach().to(device=where, dtype=torch.float32).reshape(())
                         if isinstance(s, torch.Tensor)
                         else torch.tensor(float(s), device=where) for s in steps])
    beta2 = torch.tensor(rows.beta2, dtype=torch.float32, device=where)
    numel = torch.tensor([g.numel() for g in rows.grads], dtype=torch.float32, device=where)
    return ((1.0 - beta2.pow(count)) / numel.clamp_min(1.0)).to(device)
