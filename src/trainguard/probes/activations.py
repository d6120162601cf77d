"""Activation range, sparsity and non-finite share via forward hooks, attached on sampled steps.

Metric keys (per hooked module, in the order the modules ran; registered in
`trainguard.registry`, local to each rank):
    act_maxabs      max |output|
    act_zero_frac   share of exact zeros (sparsity; dead ReLUs show here)
    act_nonfinite   share of NaN/inf values
    act_fp16        1 when the output was float16 (so its limit is 65504), else 0
    act_dead_frac   share of units (every position of one sample's output) that are exactly
                    zero for every sample of the batch: dead ReLUs, unlike the ~50% of zeros
                    a healthy ReLU layer shows at any one time
    act_batch_spread  mean over units of the spread across the batch, relative to the mean
                    |output|: 0 when every sample gets the same output (a collapsed layer)
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

log = logging.getLogger("trainguard")


def training_forward(module: nn.Module) -> bool:
    """Whether this forward is one training learns from: the module in train mode and gradients
    recorded. Sampling completions (GRPO), a reference model's pass, an evaluation inside the
    step and a reentrant checkpoint's first pass run without gradients (the checkpoint's
    recomputation, with them, is read instead)."""
    return module.training and torch.is_grad_enabled()


def first_float_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output if output.is_floating_point() else None
    if isinstance(output, (tuple, list)):
        for item in output:
            found = first_float_tensor(item)
            if found is not None:
                return found
    if isinstance(output, dict):
        for item in output.values():
            found = first_float_tensor(item)
            if found is not None:
                return found
    if hasattr(output, "to_tuple"):  # transformers ModelOutput
        return first_float_tensor(output.to_tuple())
    return None


SKIPPED_MODULES = (nn.Dropout, nn.Identity)
"""Leaf modules whose output says nothing new (dropout zeros would read as dead units)."""


class ActivationProbe:
    """Hooks every leaf module except dropout and identity while attached; reads the forwards
    run with gradients enabled, the ones training learns from."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._names: list[str] = []
        self._stats: list[torch.Tensor] = []
        self.failures = 0

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def attach(self) -> None:
        if self._handles:
            return
        self._names, self._stats = [], []
        for name, module in self.model.named_modules():
            if (name and not any(True for _ in module.children())
                    and not isinstance(module, SKIPPED_MODULES)):
                self._handles.append(module.register_forward_hook(self._hook(name)))

    def _hook(self, name: str):
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if not torch.is_grad_enabled():  # see `training_forward`: a sampling pass's
                return  # constant start token is no collapsed layer
            try:
                tensor = first_float_tensor(output)
                if tensor is None or tensor.numel() == 0:
                    return
                with torch.no_grad():
                    t = tensor.detach()
                    n = t.numel()
                    low, high = torch.aminmax(t)  # NaN and inf show through both
                    stats = torch.stack([
                        torch.maximum(low.abs(), high.abs()).float(),
                        1.0 - torch.count_nonzero(t).float() / n,
                        torch.count_nonzero(t - t).float() / n,  # inf - inf and NaN give NaN
                        torch.ones((), device=t.device) * float(t.dtype == torch.float16),
                        *batch_unit_stats(t),
                    ])
            except Exception as exc:  # never break the user's forward pass
                self.failures += 1
                log.debug("trainguard: activation probe skipped %s (%s)", name, exc)
                return
            self._names.append(name)
            self._stats.append(stats)
        return hook

    def detach(self) -> tuple[list[str], dict[str, torch.Tensor]] | None:
        """Remove the hooks; return the module names and stacked stats of the forward they saw."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if not self._stats:
            return None
        device = self._stats[0].device
        table = torch.stack([s.to(device) for s in self._stats])
        names, self._names, self._stats = self._names, [], []
        return names, {"act_maxabs": table[:, 0], "act_zero_frac": table[:, 1],
                       "act_nonfinite": table[:, 2], "act_fp16": table[:, 3],
                       "act_dead_frac": table[:, 4], "act_batch_spread": table[:, 5]}


def batch_unit_stats(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(share of units zero for every sample, spread across the batch relative to |output|).
    A unit is one position of a sample's output (dim 0 is the batch); an output without a batch
    of at least two reads as (0, 1): nothing to judge."""
    if t.dim() < 2 or t.shape[0] < 2:
        return t.new_zeros((), dtype=torch.float32), t.new_ones((), dtype=torch.float32)
    units = t.reshape(t.shape[0], -1).float()
    size = units.abs()
    # a unit is alive where its largest |value| is not 0 (NaN is not 0, as `ne(0).any` says)
    dead = 1.0 - size.amax(dim=0).ne(0).float().mean()
    # the sample standard deviation of each unit, spelled out: `std(dim=0)` on a CPU took about
    # ten times as long (235 against 24 us on a 64 x 512 ReLU output)
    centred = units - units.mean(dim=0)
    std = (centred.square().sum(dim=0) / (units.shape[0] - 1)).sqrt()
    spread = std.mean() / size.mean().clamp_min(1e-12)
    return dead, spread
