"""Weight health and update size, measured on sampled steps only.

Metric keys (per watched parameter, one array per key):
    weight_mean, weight_std, weight_maxabs   statistics of the values after the step
    weight_nonfinite                         count of NaN/inf values
    weight_norm                              L2 norm after the step
    update_ratio                             ||W_after - W_before|| / max(||W_before||, ||W_after||)
                                             (when a copy from before the step exists; the max
                                             keeps zero-initialised biases at 1, not infinity)
"""

from __future__ import annotations

import torch

from trainguard.params import WatchedParams

WEIGHT_KEYS = ("weight_mean", "weight_std", "weight_maxabs", "weight_nonfinite", "weight_norm")


class WeightProbe:
    def __init__(self, watched: WatchedParams) -> None:
        self.watched = watched
        self._before: list[torch.Tensor] | None = None

    def remember(self) -> None:
        """Copy the weights before the optimizer step, to measure the update afterwards."""
        with torch.no_grad():
            self._before = [p.detach().clone() for p in self.watched.params]

    def forget(self) -> None:
        self._before = None

    @torch.no_grad()
    def measure(self, device: torch.device) -> dict[str, torch.Tensor]:
        params = [p.detach() for p in self.watched.params]
        means, stds, maxabs, nonfinite = [], [], [], []
        for p in params:
            values = p.float() if p.dtype != torch.float32 else p
            std, mean = torch.std_mean(values, correction=0) if values.numel() else (
                values.new_zeros(()), values.new_zeros(()))
            means.append(mean)
            stds.append(std)
            maxabs.append(torch.linalg.vector_norm(values, float("inf")))
            nonfinite.append((~torch.isfinite(values)).sum())

        def stack(xs: list[torch.Tensor]) -> torch.Tensor:
            return torch.stack([x.to(device=device, dtype=torch.float32) for x in xs])

        norms = torch._foreach_norm(params, 2, dtype=torch.float32)
        out = {"weight_mean": stack(means), "weight_std": stack(stds),
               "weight_maxabs": stack(maxabs), "weight_nonfinite": stack(nonfinite),
               "weight_norm": stack(list(norms))}
        if self._before is not None:
            deltas = torch._foreach_sub(params, self._before)
            delta_norms = stack(list(torch._foreach_norm(deltas, 2, dtype=torch.float32)))
            before_norms = stack(list(torch._foreach_norm(self._before, 2, dtype=torch.float32)))
            scale = torch.maximum(before_norms, out["weight_norm"]).clamp_min(1e-12)
            out["update_ratio"] = delta_norms / scale
            self._before = None
        return out
