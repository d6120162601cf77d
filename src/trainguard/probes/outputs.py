"""What the model predicts, on sampled steps: a forward hook on the model itself.

Metric keys (one value each per sampled step; registered in `trainguard.registry`):
    out_kind         1 for class scores (logits of a classifier, B x C, or a language model,
                     B x T x V), 0 for a continuous output (regression, predicted noise, images)
    out_classes      C, the width of the class scores (0 for a continuous output)
    out_mode_share   share of the predictions (argmax over every sample and position) that are
                     the most common class: 1.0 when every sample predicts the same class
    out_mode_class   that most common class
    out_std          standard deviation of the output's values (a collapsed denoiser's predicted
                     noise goes to 0, an exploding one far above 1)
    out_count        how many predictions (samples x positions) or values that was

The output is the model's own: `logits` of a transformers ModelOutput, `sample` of a diffusers
one, or the first floating tensor it returns. One small pass over it, on the device.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from trainguard.probes.activations import first_float_tensor, training_forward

log = logging.getLogger("trainguard")

OUTPUT_KEYS = ("out_kind", "out_classes", "out_mode_share", "out_mode_class", "out_std",
               "out_count")


def model_output_tensor(output: Any) -> torch.Tensor | None:
    for name in ("logits", "sample"):
        value = output.get(name) if isinstance(output, Mapping) else getattr(output, name, None)
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value
    return first_float_tensor(output)


def output_stats(t: torch.Tensor) -> torch.Tensor:
    """The OUTPUT_KEYS of one output tensor, stacked (float32, on its device)."""
    t = t.detach()
    zero = t.new_zeros((), dtype=torch.float32)
    std = t.float().std() if t.numel() > 1 else zero
    if t.dim() in (2, 3) and t.shape[-1] >= 2 and t.shape[0] >= 2:
        classes = t.shape[-1]
        predictions = t.argmax(dim=-1).reshape(-1)
        counts = torch.bincount(predictions, minlength=classes)
        top = counts.max()
        return torch.stack([zero + 1, zero + classes, top.float() / predictions.numel(),
                            counts.argmax().float(), std, zero + predictions.numel()])
    return torch.stack([zero, zero, zero, zero - 1, std, zero + t.numel()])


class OutputProbe:
    """Attached for sampled steps only, like the activation probe."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._handle: torch.utils.hooks.RemovableHandle | None = None
        self._stats: torch.Tensor | None = None

    @property
    def attached(self) -> bool:
        return self._handle is not None

    def attach(self) -> None:
        if self._handle is None:
            self._stats = None
            self._handle = self.model.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if not training_forward(module):
            return
        try:
            tensor = model_output_tensor(output)
            if tensor is not None and tensor.numel():
                with torch.no_grad():
                    self._stats = output_stats(tensor)  # the last forward of the step counts
        except Exception as exc:  # never break the user's forward pass
            log.debug("trainguard: output probe skipped (%s)", exc)

    def detach(self) -> dict[str, torch.Tensor] | None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        stats, self._stats = self._stats, None
        if stats is None:
            return None
        return {key: stats[i] for i, key in enumerate(OUTPUT_KEYS)}
