"""Remedies change training: clipping, skipping a step. They reuse norms the probes measured."""

from trainguard.remedies.clip import clip_coefficient, scale_grads
from trainguard.remedies.skip import drop_grads

__all__ = ["clip_coefficient", "drop_grads", "scale_grads"]
