"""Remedies change training: clipping (global, layer-wise, adaptive, AGC) and skipping a step.

They reuse the norms the probes already measured: no second pass over the gradients. A
`GuardConfig` stores rules as specs (plain data); `build_rule` / `build_agc` make fresh rules
from them."""

from trainguard.remedies.adaptive import AdaptiveClip
from trainguard.remedies.agc import AGC
from trainguard.remedies.clip import clip_coefficient, scale_grads
from trainguard.remedies.layerwise import LayerwiseClip
from trainguard.remedies.rules import ClipRule, GlobalNormClip, apply_coefficients
from trainguard.remedies.skip import drop_grads
from trainguard.remedies.spec import (
    RULE_TYPES,
    Chain,
    agc_spec,
    build_agc,
    build_rule,
    chain,
    rule_spec,
)

__all__ = ["AGC", "RULE_TYPES", "AdaptiveClip", "Chain", "ClipRule", "GlobalNormClip",
           "LayerwiseClip", "agc_spec", "apply_coefficients", "build_agc", "build_rule", "chain",
           "clip_coefficient", "drop_grads", "rule_spec", "scale_grads"]
