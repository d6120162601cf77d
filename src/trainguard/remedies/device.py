"""Skip and clip on the device, from the norms already measured: no host read decides them.

    nonfinite_flag     1.0 when the step's loss or global gradient norm is NaN or inf, else 0.0:
                       the `found_inf` that GradScaler hands an optimizer
    clip_coefficients  min(1, max_norm / (norm + 1e-6)) as clip_grad_norm_ computes it (1.0 on a
                       non-finite norm: that step is skipped, its gradients are left alone)
    scale_on_device    the gradients times that coefficient, with clip_grad_norm_'s own op
    skip_on_device     `found_inf` given to the optimizer's next step()

PyTorch's fused Adam, AdamW and SGD take `found_inf` in their step (the GradScaler mechanism):
when it is 1 their kernel returns before touching anything, and Adam takes back the step count it
added, so a skipped step leaves parameters, moments and step count exactly as they were. Other
optimizers (foreach, per-tensor, or a fused SGD with momentum before its first step, whose
momentum buffers a skipped first step would leave uninitialised) cannot skip on the device:
`skips_on_device` says which.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from trainguard.remedies.clip import EPS

SKIPPING_TYPES: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)
"""The optimizers whose fused step honours `found_inf` exactly (moments and step count)."""


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer.step()` can be skipped on the device through `found_inf`."""
    if type(optimizer) not in SKIPPING_TYPES:  # a subclass may step otherwise
        return False
    if not getattr(optimizer, "_step_supports_amp_scaling", False):
        return False
    if not all(group.get("fused") for group in optimizer.param_groups):
        return False
    if isinstance(optimizer, torch.optim.SGD):
        # fused SGD makes its momentum buffers with empty_like at its first step, skipped or not
        return all(group.get("momentum", 0) == 0 or all(
            optimizer.state.get(p, {}).get("momentum_buffer") is not None
            for p in group["params"]) for group in optimizer.param_groups)
    return True


def _bad(value: torch.Tensor) -> torch.Tensor:
    """True where `value` is NaN or inf: 0 * inf is NaN (two kernels; isfinite takes more)."""
    return torch.isnan(value * 0)


def nonfinite_flag(global_norm: torch.Tensor,
                   loss: torch.Tensor | None = None) -> torch.Tensor:
    """A float32 scalar on the norm's device: 1.0 when the norm (or the loss) is not finite."""
    found_inf, _ = device_decision(global_norm, loss, None, skip=True)
    assert found_inf is not None
    return found_inf


def clip_coefficients(global_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The global clip factor as a float32 scalar on the device, bit for bit clip_grad_norm_'s
    (`max_norm / (norm + 1e-6)`, clamped at 1), and 1.0 where the norm is not finite."""
    _, coef = device_decision(global_norm, None, max_norm, skip=False)
    assert coef is not None
    return coef


def device_decision(global_norm: torch.Tensor, loss: torch.Tensor | None,
                    max_norm: float | None, *, skip: bool,
                    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """`(found_inf, clip factor)` of one step from its global norm (and loss), sharing the
    finiteness test: `found_inf` when `skip` (as `nonfinite_flag`), the factor when `max_norm` is
    set (as `clip_coefficients`); None for what was not asked."""
    norm_bad = _bad(global_norm)
    found_inf = None
    if skip:
        bad = norm_bad
        if loss is not None:
            bad = bad | _bad(loss.to(global_norm.device, non_blocking=True))
        found_inf = bad.to(torch.float32)
    coef = None
    if max_norm is not None:
        # max_norm / tensor is tensor.reciprocal() * max_norm in PyTorch: the same bits, in place
        coef = (global_norm + EPS).reciprocal_().mul_(max_norm)
        coef = coef.clamp_(max=1.0).masked_fill_(norm_bad, 1.0)
    return found_inf, coef


def scale_on_device(grads: list[torch.Tensor], coef: torch.Tensor) -> None:
    """Multiply the gradients by the device scalar `coef`, per device, as clip_grad_norm_ does
    (a factor of 1.0 leaves them bit for bit as they were)."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for grad in grads:
        by_device.setdefault(grad.device, []).append(grad)
    for device, group in by_device.items():
        torch._foreach_mul_(group, coef.to(device, non_blocking=True))


@contextmanager
def skip_on_device(optimizer: torch.optim.Optimizer,
                   found_inf: torch.Tensor) -> Iterator[None]:
    """Within the block, the optimizer's step() skips itself where `found_inf` is 1 (as
    GradScaler.step sets it). Only for an optimizer `skips_on_device` accepts."""
    optimizer.found_inf = found_inf  # type: ignore[attr-defined]
    optimizer.grad_scale = None  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del optimizer.found_inf  # type: ignore[attr-defined]
        del optimizer.grad_scale  # type: ignore[attr-defined]
