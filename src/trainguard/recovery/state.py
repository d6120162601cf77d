"""A copy of everything training needs to continue from one step: taken off the device, restored
in place.

Copies go to host memory so they never compete with training for accelerator memory. On a CUDA
device the copy is queued (`non_blocking` into pinned buffers) and completes in the background;
the Guard's next per-step transfer synchronises the stream anyway, so a state is complete before
anything can read it. Buffers of a state that leaves the ring are reused for the next one.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainguard.probes.local import local_tensor
from trainguard.probes.norms import float32_norms
from trainguard.snapshot import restore_rng_state, rng_state
from trainguard.transfer import to_device


@dataclass(slots=True)
class SavedState:
    step: int
    """Index of the next step when the state was taken (the state from before that step)."""
    model: dict[str, torch.Tensor]
    optimizers: list[dict[str, Any]]
    scheduler: dict[str, Any] | None
    scaler: dict[str, Any] | None
    rng: dict[str, Any] | None
    """The process-wide RNG states (torch, CUDA, Python, NumPy); kept only when a rollback is to
    put them back (`RecoveryConfig.restore_rng`): they are not this run's alone."""
    guard: dict[str, Any]
    """The run's own state (detector baselines), so a rollback also forgets the bad steps."""
    extra: dict[str, Any] = field(default_factory=dict)
    finite: torch.Tensor | None = None
    """Device flag: every weight and optimizer moment is finite (read with the next transfer)."""
    verified: bool = False
    """The finite flag was read and was true."""
    calm_steps: int = 0
    """Steps without an event or a skip since the state was taken."""

    @property
    def nbytes(self) -> int:
        total = 0
        for tensor in _tensors(self.model) + _tensors(self.optimizers):
            total += tensor.numel() * tensor.element_size()
        return total


def capture(*, step: int, model: nn.Module, optimizers: list[torch.optim.Optimizer],
            scheduler: Any, scaler: Any, guard_state: dict[str, Any],
            extra: dict[str, Any] | None = None, rng: bool = True,
            reuse: SavedState | None = None) -> SavedState:
    """Copy the training state to host memory (reusing `reuse`'s buffers when they fit); the RNG
    states too when `rng`."""
    model_state = _offload(model.state_dict(), reuse.model if reuse is not None else None)
    old_opts = reuse.optimizers if reuse is not None else []
    opt_states = [_offload(opt.state_dict(), old_opts[i] if i < len(old_opts) else None)
                  for i, opt in enumerate(optimizers)]
    return SavedState(
        step=step, model=model_state, optimizers=opt_states,
        scheduler=copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None,
        scaler=copy.deepcopy(scaler.state_dict()) if scaler is not None else None,
        rng=rng_state() if rng else None, guard=copy.deepcopy(guard_state),
        extra=dict(extra or {}),
        finite=finite_flag(model, optimizers))


def restore(state: SavedState, *, model: nn.Module, optimizers: list[torch.optim.Optimizer],
            scheduler: Any, scaler: Any, rng: bool = True) -> None:
    """Put the state back in place (the model's tensors keep their device and identity).
    `scheduler=None` leaves the schedule where it is; `rng=False` leaves the process-wide random
    number generators alone (they are shared with everything else in the process)."""
    with torch.no_grad():
        model.load_state_dict(state.model)
    for opt, saved in zip(optimizers, state.optimizers, strict=True):
        # load_state_dict may keep the given tensors as they are (same device): give it copies,
        # or the next optimizer step would write into the saved state.
        opt.load_state_dict(_clone(saved))
    if scheduler is not None and state.scheduler is not None:
        scheduler.load_state_dict(copy.deepcopy(state.scheduler))
    if scaler is not None and state.scaler is not None:
        scaler.load_state_dict(copy.deepcopy(state.scaler))
    if rng and state.rng is not None:
        restore_rng_state(state.rng)


def finite_flag(model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> torch.Tensor | None:
    """One device scalar (1.0 or 0.0): every parameter and floating optimizer state is finite.

    Fused norms, float32 accumulation: any NaN or inf makes a norm non-finite. Sharded (FSDP2)
    tensors are checked on this rank's shard; the ranks agree on the result afterwards."""
    tensors = [local_tensor(p).detach() for p in model.parameters()]
    for opt in optimizers:
        for per_param in opt.state.values():
            tensors.extend(local_tensor(v) for v in per_param.values()
                           if isinstance(v, torch.Tensor) and v.is_floating_point())
    tensors = [t for t in tensors if t.is_floating_point() and t.numel()]
    if not tensors:
        return None
    device = tensors[0].device
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_device.setdefault(tensor.device, []).append(tensor)
    flags = []
    for group in by_device.values():
        norms = float32_norms(group)
        # a CPU group (Adam's step counts) reaches the device without a wait
        flags.append(to_device(torch.stack(norms).isfinite().all(), device))
    return torch.stack(flags).all().float()


def _offload(value: Any, reuse: Any) -> Any:
    if isinstance(value, torch.Tensor):
        source = value.detach()
        if (isinstance(reuse, torch.Tensor) and reuse.shape == source.shape
                and reuse.dtype == source.dtype and reuse is not source):
            reuse.copy_(source, non_blocking=source.is_cuda)
            return reuse
        if source.is_cuda:
            target = torch.empty(source.shape, dtype=source.dtype, device="cpu", pin_memory=True)
            target.copy_(source, non_blocking=True)
            return target
        return source.clone()
    if isinstance(value, dict):
        old = reuse if isinstance(reuse, dict) else {}
        return {k: _offload(v, old.get(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        prior = reuse if isinstance(reuse, (list, tuple)) and len(reuse) == len(value) else None
        items = [_offload(v, prior[i] if prior is not None else None)
                 for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    return copy.deepcopy(value)


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_clone(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return copy.deepcopy(value)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []
