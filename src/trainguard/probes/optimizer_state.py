"""Optimizer-state health (Adam moments and friends), measured on sampled steps only.

Metric keys (per watched parameter): `optstate_<key>_norm` for each tensor-valued state entry
shaped like the parameter (for Adam: exp_avg, exp_avg_sq), registered in `trainguard.registry` as
the pattern `optstate_{state}_norm`. A NaN or inf norm means the state is poisoned. One fused pass
per state entry.
"""

from __future__ import annotations

import torch

from trainguard.params import WatchedParams
from trainguard.probes.local import local_tensor
from trainguard.probes.norms import float32_norms


class OptimizerStateProbe:
    def __init__(self, watched: WatchedParams, optimizers: list[torch.optim.Optimizer]) -> None:
        self.watched = watched
        self.optimizers = optimizers

    @torch.no_grad()
    def measure(self, device: torch.device) -> dict[str, torch.Tensor]:
        states: dict[int, dict] = {}
        for optimizer in self.optimizers:
            for param, state in optimizer.state.items():
                states[id(param)] = state
        keys: list[str] = []
        for p in self.watched.params:
            for key, value in states.get(id(p), {}).items():
                if (isinstance(value, torch.Tensor) and value.shape == p.shape
                        and value.is_floating_point() and key not in keys):
                    keys.append(key)
        out: dict[str, torch.Tensor] = {}
        for key in keys:
            index, tensors = [], []
            for i, p in enumerate(self.watched.params):
                value = states.get(id(p), {}).get(key)
                if isinstance(value, torch.Tensor) and value.shape == p.shape:
                    index.append(i)
                    tensors.append(local_tensor(value))
            norms = float32_norms(tensors)
            stacked = torch.stack([v.to(device) for v in norms])
            if len(index) != len(self.watched):  # parameters without state read as 0
                full = torch.zeros(len(self.watched), dtype=torch.float32, device=device)
                full[torch.tensor(index, device=device)] = stacked
                stacked = full
            out[f"optstate_{key}_norm"] = stacked
        return out
