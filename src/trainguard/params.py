"""Which parameters a Guard watches, and their names."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from trainguard.errors import UsageError


@dataclass(slots=True)
class WatchedParams:
    """The model's parameters that its optimizer updates, in model order.

    Parameters frozen when the Guard starts but held by the optimizer are watched too, so that
    progressive unfreezing (or a backbone unfrozen later) stays measured and clipped.
    """

    names: list[str]
    params: list[torch.Tensor]

    def __len__(self) -> int:
        return len(self.params)

    def extend(self, more: WatchedParams) -> None:
        """Watch `more` too, after the present ones: indices already handed out stay valid."""
        self.names.extend(more.names)
        self.params.extend(more.params)


def watched_params(model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> WatchedParams:
    """Match optimizer parameters to model names; reject what cannot be monitored."""
    if not isinstance(model, nn.Module):
        raise UsageError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    names_by_id: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=True):
        names_by_id.setdefault(id(param), name)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trainable:
        raise UsageError("the model has no trainable parameters (every parameter has "
                         "requires_grad=False): there is nothing to train or to watch")
    in_optimizer: set[int] = set()
    for optimizer in optimizers:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise UsageError(f"optimizer must be a torch.optim.Optimizer, got "
                             f"{type(optimizer).__name__}")
        for group in optimizer.param_groups:
            for param in group["params"]:
                if id(param) not in names_by_id:
                    raise UsageError(
                        f"the optimizer holds a parameter of shape {tuple(param.shape)} that is "
                        "not in the model: build the optimizer from this model's parameters "
                        "(model.parameters()) or pass the model that owns them")
                in_optimizer.add(id(param))
    held = [(n, p) for n, p in model.named_parameters() if id(p) in in_optimizer]
    if not any(p.requires_grad for _, p in held):
        raise UsageError("none of the model's trainable parameters is in the optimizer")
    names = [n for n, _ in held]
    params: list[torch.Tensor] = [p for _, p in held]
    return WatchedParams(names=names, params=params)


def unheld_trainable(model: nn.Module, watched: WatchedParams) -> dict[str, bool]:
    """The model's parameters with `requires_grad` that no optimizer holds, by name, each with
    whether it has a gradient: a parameter unfrozen after the optimizer was built is computed a
    gradient that nothing applies. One pass over the parameters in Python: for sampled steps."""
    held = {id(p) for p in watched.params}
    return {name: param.grad is not None
            for name, param in model.named_parameters()
            if param.requires_grad and id(param) not in held}


def optimizer_param_count(optimizers: list[torch.optim.Optimizer]) -> int:
    """How many parameters the optimizers hold: a cheap per-step check for `add_param_group`."""
    return sum(len(group["params"]) for opt in optimizers for group in opt.param_groups)


def new_params(watched: WatchedParams, model: nn.Module,
               optimizers: list[torch.optim.Optimizer]) -> WatchedParams:
    """The parameters the optimizers hold that `watched` does not (added with
    `optimizer.add_param_group` after the Guard started), in model order."""
    known = {id(p) for p in watched.params}
    fresh = watched_params(model, optimizers)
    pairs = [(n, p) for n, p in zip(fresh.names, fresh.params, strict=True) if id(p) not in known]
    return WatchedParams(names=[n for n, _ in pairs], params=[p for _, p in pairs])
