"""Real models, real optimizers and the norms the Guard's `measure` stage finds for them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from trainguard import GuardConfig
from trainguard.pipeline import Run, StepContext
from trainguard.pipeline.measure import measure as measure_stage

QUIET = {"sinks": {"console": False}, "probes": {"activations": False}}


@dataclass
class Measured:
    """One step as the Guard sees it: host norms, names and the watched parameters."""

    norms: np.ndarray
    global_norm: float
    names: list[str]
    params: list[torch.Tensor]


def measure(model: nn.Module, optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> Measured:
    """Measure the gradients already in `model` through the `measure` stage's single transfer."""
    run = Run(model, optimizer, config=GuardConfig(**QUIET))
    ctx = StepContext(step=0, loss=loss)
    signals = measure_stage(ctx, run.state, run.services).signals
    run.close()
    return Measured(signals.param_grad_norm, signals.grad_norm, list(run.watched.names),
                    list(run.watched.params))


def grad_copy(model: nn.Module, reference: nn.Module) -> None:
    """Give `reference` (a deep copy of `model`) clones of `model`'s gradients."""
    for param, ref in zip(model.parameters(), reference.parameters(), strict=True):
        ref.grad = None if param.grad is None else param.grad.clone()


def grads(model: nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]
