"""Weight health and update size, measured on sampled steps only, with fused multi-tensor ops.

Metric keys (per watched parameter, one array per key; each registered in `trainguard.registry`
with its cross-rank reduction):
    weight_mean, weight_std, weight_maxabs   statistics of the values after the step
    weight_nonfinite                         1 when the parameter holds any NaN/inf, else 0
    weight_norm                              L2 norm after the step
    update_ratio                             ||W_after - W_before|| / max(||W_before||, ||W_after||)
                                             (when a copy from before the step exists; the max
                                             keeps zero-initialised biases at 1, not infinity)

Three cheap passes over the weights (L2 norm fused across parameters, min/max, sum); the
standard deviation comes from the first and second moments, and NaN/inf show through min/max.
The update ratio needs one copy of the weights from before the step, subtracted in place.
"""

from __future__ import annotations

import torch

from trainguard.params import WatchedParams
from trainguard.probes.local import local_tensor
from trainguard.probes.norms import float32_norms


class WeightProbe:
    def __init__(self, watched: WatchedParams) -> None:
        self.watched = watched
        self._before: list[torch.Tensor] | None = None
        self._before_norms: list[torch.Tensor] | None = None
        self._numel: torch.Tensor | None = None

    def remember(self) -> None:
        """Copy the weights before the optimizer step, to measure the update afterwards."""
        with torch.no_grad():
            self._before = [p.clone() for p in self._local_params()]
            self._before_norms = float32_norms(self._before)

    def _local_params(self) -> list[torch.Tensor]:
        """This rank's part of every weight (its shard under FSDP2). An uneven split can leave a
        rank an empty shard, which reads as one zero (aminmax refuses empty tensors)."""
        local = (local_tensor(p).detach() for p in self.watched.params)
        return [t if t.numel() else t.new_zeros(1) for t in local]

    def forget(self) -> None:
        self._before = None
        self._before_norms = None

    @torch.no_grad()
    def measure(self, device: torch.device) -> dict[str, torch.Tensor]:
        params = self._local_params()

        def stack(xs: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> torch.Tensor:
            return torch.stack([x.to(device=device, dtype=torch.float32) for x in xs])

        if self._numel is None or self._numel.device != device:
            self._numel = torch.tensor([max(p.numel(), 1) for p in params], dtype=torch.float32,
                                       device=device)
        norms = stack(float32_norms(params))
        extremes = [torch.aminmax(p) for p in params]
        maxabs = torch.maximum(stack([e.min for e in extremes]).abs(),
                               stack([e.max for e in extremes]).abs())
        mean = stack([p.sum(dtype=torch.float32) for p in params]) / self._numel
        var = (norms.square() / self._numel - mean.square()).clamp_min(0)
        out = {"weight_mean": mean, "weight_std": var.sqrt(), "weight_maxabs": maxabs,
               "weight_nonfinite": (~torch.isfinite(maxabs)).float(), "weight_norm": norms}
        if self._before is not None and self._before_norms is not None:
            torch._foreach_sub_(self._before, params)  # before - after, in place: no second copy
            delta_norms = stack(float32_norms(self._before))
            scale = torch.maximum(stack(self._before_norms), norms).clamp_min(1e-12)
            out["update_ratio"] = delta_norms / scale
            self.forget()
        return out
