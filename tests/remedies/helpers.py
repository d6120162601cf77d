"""Real models, real optimizers and the norms the Guard's engine measures for them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from trainguard import GuardConfig
from trainguard.engine import Engine

QUIET = {"console": False, "activation_probe": False}


@dataclass
class Measured:
    """One step as the Guard sees it: host norms, names and the watched parameters."""

    norms: np.ndarray
    global_norm: float
    names: list[str]
    params: list[torch.Tensor]


def measure(model: nn.Module, optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> Measured:
    """Measure the gradients already in `model` through the engine's single transfer."""
    engine = Engine(model, [optimizer], config=GuardConfig(**QUIET))
    signals = engine.measure(loss).signals
    engine.close()
    return Measured(signals.param_grad_norm, signals.grad_norm, list(engine.watched.names),
                    list(engine.watched.params))


def grad_copy(model: nn.Module, reference: nn.Module) -> None:
    """Give `reference` (a deep copy of `model`) clones of `model`'s gradients."""
    for param, ref in zip(model.parameters(), reference.parameters(), strict=True):
        ref.grad = None if param.grad is None else param.grad.clone()


def grads(model: nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]
