"""Remedies change training: clipping (global, layer-wise, adaptive, AGC) and skipping a step.

They reuse the norms the probes already measured: no second pass over the gradients."""

from trainguard.remedies.adaptive import AdaptiveClip
from trainguard.remedies.agc import AGC
from trainguard.remedies.clip import clip_coefficient, scale_grads
from trainguard.remedies.layerwise import LayerwiseClip
from trainguard.remedies.rules import (
    Chain,
    ClipRule,
    GlobalNormClip,
    apply_coefficients,
    chain,
)
from trainguard.remedies.skip import drop_grads

__all__ = ["AGC", "AdaptiveClip", "Chain", "ClipRule", "GlobalNormClip", "LayerwiseClip",
           "apply_coefficients", "chain", "clip_coefficient", "drop_grads", "scale_grads"]
