"""Replay a bad step with hooks and name where it went wrong.

`replay(model, batch, loss_fn)` reruns the forward and backward of one batch on the model as it
is (restore the state from just before the bad step first, e.g. from a crash snapshot), with
forward hooks on every module and a gradient hook on every parameter, and reports:

- the first module, in execution order, whose output is non-finite, and the first whose output
  goes beyond the float16 range (65504), with the module's type as the op;
- the first parameter, in the order backward produced them, whose gradient is non-finite, and
  the parameter whose gradient is largest relative to its weight;
- whether a second run gives the same answer (deterministic) or not (transient, hardware-like).

Nothing here runs on healthy steps: it is called on demand, after something went wrong. The
model's parameters are left untouched (gradients are cleared afterwards).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainguard.probes.activations import first_float_tensor
from trainguard.rng import put_torch_state, torch_state

FP16_MAX = 65504.0
LossFn = Callable[[nn.Module, Any], torch.Tensor]


@dataclass
class ModuleHit:
    module: str
    op: str
    maxabs: float
    nonfinite: int
    order: int


@dataclass
class ReplayRun:
    loss: float
    first_nonfinite_module: ModuleHit | None = None
    first_overflow_module: ModuleHit | None = None
    first_nonfinite_grad: str | None = None
    largest_relative_grad: tuple[str, float] | None = None
    grad_order: list[str] = field(default_factory=list)
    error: str | None = None

    def key(self) -> tuple:
        """What must agree between runs for the fault to count as deterministic."""
        module = self.first_nonfinite_module.module if self.first_nonfinite_module else None
        return (module, self.first_nonfinite_grad, math.isfinite(self.loss))


@dataclass
class ReplayReport:
    runs: list[ReplayRun]

    @property
    def first(self) -> ReplayRun:
        return self.runs[0]

    @property
    def deterministic(self) -> bool:
        return len({run.key() for run in self.runs}) == 1

    def summary(self) -> str:
        run = self.first
        parts = [f"replayed loss {run.loss:.4g}"]
        if run.first_nonfinite_module:
            hit = run.first_nonfinite_module
            parts.append(f"first non-finite output: {hit.module} ({hit.op})")
        if run.first_overflow_module:
            hit = run.first_overflow_module
            parts.append(f"first output beyond float16: {hit.module} ({hit.op}, "
                         f"|x| {hit.maxabs:.3g})")
        if run.first_nonfinite_grad:
            parts.append(f"first non-finite gradient: {run.first_nonfinite_grad}")
        if run.largest_relative_grad:
            name, ratio = run.largest_relative_grad
            parts.append(f"largest gradient relative to its weight: {name} ({ratio:.3g})")
        if run.error:
            parts.append(f"the replay raised {run.error}")
        parts.append("deterministic" if self.deterministic
                     else "NOT deterministic: a rerun gave a different answer (transient fault)")
        return "; ".join(parts)


def _run_once(model: nn.Module, batch: Any, loss_fn: LossFn) -> ReplayRun:
    hits: list[ModuleHit] = []
    handles = []
    order = [0]

    def forward_hook(name: str):
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            tensor = first_float_tensor(output)
            if tensor is None or tensor.numel() == 0:
                return
            with torch.no_grad():
                t = tensor.detach()
                nonfinite = int((~torch.isfinite(t)).sum())
                finite = t[torch.isfinite(t)]
                maxabs = float(finite.abs().max()) if finite.numel() else math.inf
            hits.append(ModuleHit(name, type(module).__name__, maxabs, nonfinite, order[0]))
            order[0] += 1
        return hook

    grad_order: list[str] = []
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for name, module in model.named_modules():
        handles.append(module.register_forward_hook(forward_hook(name or type(module).__name__)))
    for name, param in named:
        handles.append(param.register_post_accumulate_grad_hook(
            lambda p, name=name: grad_order.append(name)))
    saved_grads = {name: p.grad for name, p in named}
    for _, p in named:
        p.grad = None
    error = None
    loss_value = math.nan
    try:
        loss = loss_fn(model, batch)
        loss_value = float(loss.detach().float())
        loss.backward()
    except Exception as exc:  # a crash is also an answer
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    finally:
        for handle in handles:
            handle.remove()
    run = ReplayRun(loss=loss_value, grad_order=grad_order, error=error)
    run.first_nonfinite_module = next((h for h in hits if h.nonfinite), None)
    run.first_overflow_module = next((h for h in hits if h.maxabs > FP16_MAX), None)
    params = dict(named)
    with torch.no_grad():
        best: tuple[str, float] | None = None
        for name in grad_order:
            grad = params[name].grad
            if grad is None:
                continue
            norm = float(grad.float().norm())
            if not math.isfinite(norm) and run.first_nonfinite_grad is None:
                run.first_nonfinite_grad = name
            if math.isfinite(norm):
                ratio = norm / max(float(params[name].float().norm()), 1e-12)
                if best is None or ratio > best[1]:
                    best = (name, ratio)
        run.largest_relative_grad = best
    for name, p in named:
        p.grad = saved_grads[name]
    return run


def replay(model: nn.Module, batch: Any, loss_fn: LossFn, *, runs: int = 2) -> ReplayReport:
    """Rerun one batch `runs` times with hooks; see the module docstring."""
    was_training = model.training
    model.train()
    rng = torch_state()  # every run sees the same dropout masks (CUDA's too): only faults differ
    results = []
    try:
        for _ in range(max(1, runs)):
            put_torch_state(rng)
            results.append(_run_once(model, batch, loss_fn))
        return ReplayReport(results)
    finally:
        put_torch_state(rng)
        model.train(was_training)
