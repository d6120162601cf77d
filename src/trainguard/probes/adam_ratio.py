"""Adam's second moment lagging the gradient, measured from the optimizer state on the steps
`instability_precursor`'s cadence asks for (`InstabilityPrecursor.due`: every step near a bound).

Metric key (per watched parameter, every step): `adam_ratio_rms`, the ratio of the gradient's
RMS to the RMS of sqrt(v_hat) over the parameter's elements,

    sqrt(sum g^2 / sum v_hat),   v_hat = (v + eps^2) / (1 - beta2^t),

where g is the step's gradient (final and unscaled, before the optimizer step) and v_hat is
Adam's bias-corrected second moment from the steps before (`exp_avg_sq` after t updates). On a
steady run it stays near 1 (v is a running average of g^2); it rises when the gradient grows
faster than Adam's running average of it (an LR past what the weights can take, a parameter
whose v decayed while it got no gradient), which tends to come some steps before the loss moves
(Wortsman et al. 2023, arXiv 2304.13013). A parameter without a gradient or without Adam state
yet reads 0, and so does every parameter of a non-Adam optimizer.

Cost: sum g^2 is the square of the per-parameter gradient norm the step already computes
(`probes/gradients.py`, handed in). sum v is carried from step to step by Adam's own recursion,
sum v_t = beta2 sum v_(t-1) + (1 - beta2) sum g_t^2, one operation on a vector of one value per
parameter, after each optimizer step whose gradients were the ones measured (`_Carried`); it is
summed over `exp_avg_sq` itself (one fused L1 norm, v >= 0; one sum per tensor on a CPU, where
that is faster) every `RESYNC_EVERY` measurements and whenever the carry cannot be trusted:
the first measurement, gradients changed after they were measured (a clip), a step skipped on
the device or taken twice, moments written by anything else (a rollback, a load), an optimizer
whose v does not follow the recursion (Adam with L2 weight decay folded into the gradient, any
other class). The bias corrections are one small tensor operation on constants kept from step
to step. Nothing is read on the host: the values ride the step's one transfer. (Summing v every
step cost 0.5-0.7% of a GPT-2 step on a CPU; an element-wise RMS of g / sqrt(v_hat) took four
fused passes and about 1.5%.)

Metric key (per watched parameter, every step, with `updates=True`: off by default, see
`DetectorConfig.instability_precursor.update_rms`): `adam_update_rms`, the RMS of
the update Adam applied at the step before, as a multiple of the LR,

    sqrt(sum m_hat^2 / sum v_hat),   m_hat = m / (1 - beta1^t),

with m = `exp_avg` and v_hat as above, both as the previous step left them (this probe runs
before the step's own update). It is a proxy of the exact RMS of u = m_hat / (sqrt(v_hat) + eps)
over the tensor: the two agree when v_hat is about uniform over it, and the proxy weighs the
elements by their moments, as ||dW|| does. Why the proxy: the exact form needs a square root, a
division and a norm element by element (the four passes above: 2.6-3.8% of a GPT-2 step on a
CPU); the proxy adds one fused L2 norm over `exp_avg` to the sum over `exp_avg_sq` already
taken (0.5-0.6%). Noise alone keeps it low
(|m| << sqrt(v)); gradients that keep one direction step after step (logits pushed ever up, an
oscillation the LR cannot damp) lift it towards 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from trainguard.params import WatchedParams
from trainguard.probes.local import local_tensor
from trainguard.probes.norms import float32_norms
from trainguard.transfer import to_device

RESYNC_EVERY = 16
"""Measurements between two sums over `exp_avg_sq` when the recursion carries sum v: bounds the
float32 rounding it accumulates and any change to the moments the hooks did not see."""

RECURSIVE_TYPES: tuple[type[torch.optim.Optimizer], ...] = (torch.optim.Adam, torch.optim.AdamW)
"""The optimizers whose `exp_avg_sq` is exactly beta2 v + (1 - beta2) g^2 of the gradient the
step was given (a subclass may update it otherwise)."""


@dataclass
class _Carried:
    """sum v of each row, and what must hold for the recursion to carry it to the next step."""
    key: tuple[Any, ...]
    """The rows and the identity of their moment tensors."""
    sums: torch.Tensor
    """sum v of each row as the optimizer left it (float32, on the device)."""
    versions: list[int]
    """Each row's `exp_avg_sq._version` when `sums` held: a change no hook saw is a write."""
    age: int
    """Measurements since the last sum over the moments."""
    squares: torch.Tensor | None = None
    """sum g^2 of each row measured for the step about to be taken (None once taken)."""
    params: list[torch.Tensor] = field(default_factory=list)
    """Each row's parameter."""
    grads: list[tuple[int, int]] = field(default_factory=list)
    """(id, _version) of each row's gradient when measured: the step must be given those."""
    beta2: torch.Tensor | None = None
    """Each row's beta2, on the device."""
    valid: bool = True
    checked: bool = False
    """The pre-step hook found the measured gradients in place: the optimizer step between the
    two hooks reads them without writing them, so the post-step hook need not look again."""


@dataclass
class _Fixed:
    """What stays the same from step to step for the same rows."""
    where: torch.Tensor
    every: bool
    floor: torch.Tensor
    """numel x eps^2: Adam's eps inside v_hat, summed over the tensor."""
    beta2: torch.Tensor
    """On the CPU, where the step counts usually are."""
    beta1: torch.Tensor | None = None
    """Like `beta2`; None when some row has no `exp_avg` (no update RMS then)."""
    recursive: bool = False
    """sum v may be carried by the recursion (`RECURSIVE_TYPES`, no L2 weight decay)."""
    beta2_here: torch.Tensor | None = None
    """`beta2` on the device, for the recursion."""


@dataclass
class _Rows:
    index: list[int] = field(default_factory=list)
    moments: list[torch.Tensor] = field(default_factory=list)
    steps: list[torch.Tensor | float] = field(default_factory=list)
    beta2: list[float] = field(default_factory=list)
    eps2: list[float] = field(default_factory=list)
    numel: list[int] = field(default_factory=list)
    firsts: list[torch.Tensor | None] = field(default_factory=list)
    """Each row's `exp_avg` (None: the optimizer keeps none)."""
    beta1: list[float] = field(default_factory=list)
    recursive: bool = True
    """Every row's v follows the recursion (`RECURSIVE_TYPES`, no L2 weight decay)."""


def _recursive(optimizer: torch.optim.Optimizer, group: dict) -> bool:
    """Whether this group's `exp_avg_sq` follows beta2 v + (1 - beta2) g^2 of the step's grad
    (Adam folds an L2 weight decay into g first, unless it is decoupled)."""
    if type(optimizer) not in RECURSIVE_TYPES:
        return False
    if isinstance(optimizer, torch.optim.AdamW) or group.get("decoupled_weight_decay"):
        return True
    return not group.get("weight_decay")


def _adam_group(group: dict) -> tuple[float, float] | None:
    """(beta2, eps) of an Adam-family parameter group; None for any other optimizer."""
    betas, eps = group.get("betas"), group.get("eps")
    if not isinstance(betas, (tuple, list)) or len(betas) < 2:
        return None
    beta2 = betas[1]
    if not isinstance(beta2, (int, float)) or not isinstance(eps, (int, float)):
        return None  # a tensor beta (capturable variants) would need a host read: left out
    return float(beta2), float(eps)


def _beta1(group: dict) -> float:
    beta1 = group["betas"][0]
    return float(beta1) if isinstance(beta1, (int, float)) else 0.0


class AdamRatioProbe:
    def __init__(self, watched: WatchedParams, optimizers: list[torch.optim.Optimizer],
                 updates: bool = False) -> None:
        self.watched = watched
        self.optimizers = optimizers
        self.updates = updates
        """Also measure `adam_update_rms` (one more fused norm, over `exp_avg`)."""
        self._index = {id(p): i for i, p in enumerate(watched.params)}
        self._cache: tuple[tuple[Any, ...], _Fixed] | None = None
        self._carried: _Carried | None = None
        self._hooks: list[RemovableHandle] = []

    def close(self) -> None:
        """Remove the optimizer hooks that carry sum v."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self._carried = None

    def _rows(self) -> _Rows:
        index = self._index
        if len(index) != len(self.watched.params):  # the watched list grew
            index = self._index = {id(p): i for i, p in enumerate(self.watched.params)}
        rows = _Rows()
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                adam = _adam_group(group)
                if adam is None:
                    continue
                recursive = _recursive(optimizer, group)
                for p in group["params"]:
                    i, state = index.get(id(p)), optimizer.state.get(p)
                    if i is None or p.grad is None or not state:
                        continue
                    v, step = state.get("exp_avg_sq"), state.get("step")
                    if not isinstance(v, torch.Tensor) or v.shape != p.shape or step is None:
                        continue
                    rows.index.append(i)
                    rows.moments.append(local_tensor(v))
                    rows.steps.append(step)
                    rows.beta2.append(adam[0])
                    rows.eps2.append(adam[1] ** 2)
                    rows.numel.append(v.numel())
                    m = state.get("exp_avg")
                    rows.firsts.append(local_tensor(m) if isinstance(m, torch.Tensor)
                                       and m.shape == p.shape else None)
                    rows.beta1.append(_beta1(group))
                    rows.recursive &= recursive
        rows.recursive &= len(self.optimizers) == 1
        return rows

    def _fixed(self, rows: _Rows, device: torch.device) -> _Fixed:
        """The rows' constants on `device`, made again only when the rows change."""
        key = (tuple(rows.index), tuple(rows.beta2), tuple(rows.eps2), tuple(rows.numel),
               tuple(rows.beta1), tuple(m is None for m in rows.firsts), rows.recursive, device)
        if self._cache is None or self._cache[0] != key:
            numel = torch.tensor(rows.numel, dtype=torch.float32, device=device)
            eps2 = torch.tensor(rows.eps2, dtype=torch.float32, device=device)
            self._cache = (key, _Fixed(
                where=torch.tensor(rows.index, device=device),
                every=rows.index == list(range(len(self.watched))),
                floor=numel * eps2,
                beta2=torch.tensor(rows.beta2, dtype=torch.float32),
                beta1=(torch.tensor(rows.beta1, dtype=torch.float32)
                       if all(m is not None for m in rows.firsts) else None),
                recursive=rows.recursive,
                beta2_here=torch.tensor(rows.beta2, dtype=torch.float32, device=device)))
        return self._cache[1]

    @torch.no_grad()
    def measure(self, device: torch.device,
                grad_norms: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """`grad_norms`: the L2 norm of each watched parameter's gradient, float32 on `device`
        (the gradient probe's `param_grad_norm`); computed here when not given."""
        rows = self._rows()
        if not rows.index:
            zeros = torch.zeros(len(self.watched), dtype=torch.float32, device=device)
            return {"adam_ratio_rms": zeros, **({"adam_update_rms": zeros} if self.updates
                                                else {})}
        fixed = self._fixed(rows, device)
        if grad_norms is None:
            grads = [local_tensor(g) for g in (self.watched.params[i].grad for i in rows.index)
                     if g is not None]  # every row has one (`_rows`)
            squares = torch.stack([n.to(device) for n in float32_norms(grads)]).square()
        else:
            norms = grad_norms.to(device=device, dtype=torch.float32)
            squares = (norms if fixed.every else norms[fixed.where]).square()
        sums = self._moment_sums(rows, fixed, squares, device)
        count = _step_counts(rows, device)
        denominator = sums + fixed.floor
        # the constants where the step counts are (on the device for fused and capturable
        # optimizers): a plain copy of host constants there would wait for the device
        beta2 = (fixed.beta2_here if count.device == device and fixed.beta2_here is not None
                 else fixed.beta2)
        correction = to_device(1.0 - to_device(beta2, count.device).pow(count), device)
        values = {"adam_ratio_rms": (squares * correction / denominator).sqrt()}
        if self.updates:
            values["adam_update_rms"] = _update_rms(rows, fixed, count, correction,
                                                    denominator, device)
        if fixed.every:  # every watched parameter has a row, in order: no scatter
            return values
        full = {}
        for key, value in values.items():
            full[key] = torch.zeros(len(self.watched), dtype=torch.float32, device=device)
            full[key][fixed.where] = value
        return full


    def _moment_sums(self, rows: _Rows, fixed: _Fixed, squares: torch.Tensor,
                     device: torch.device) -> torch.Tensor:
        """sum v of each row: carried by the recursion when it can be trusted, else summed over
        the moments; either way the step's `squares` are kept for the next recursion."""
        carried = self._carried
        key = (self._cache[0] if self._cache else None, tuple(id(v) for v in rows.moments))
        if (carried is not None and carried.valid and carried.squares is None
                and carried.key == key and carried.age < RESYNC_EVERY
                and all(v._version == seen for v, seen in zip(
                    rows.moments, carried.versions, strict=True))):
            sums, age = carried.sums, carried.age + 1
        else:
            sums, age = torch.stack([n.to(device=device, dtype=torch.float32)
                                     for n in _l1_norms(rows.moments)]), 0
        if not fixed.recursive:
            self._carried = None
            return sums
        if not self._hooks:
            for optimizer in self.optimizers:
                self._hooks += [optimizer.register_step_pre_hook(self._before_step),
                                optimizer.register_step_post_hook(self._after_step)]
        params = [self.watched.params[i] for i in rows.index]
        self._carried = _Carried(
            key=key, sums=sums, versions=[v._version for v in rows.moments], age=age,
            squares=squares, params=params, beta2=fixed.beta2_here,
            grads=[(id(p.grad), _version_of(p.grad)) for p in params])
        return sums

    def scaled(self, coef: torch.Tensor) -> None:
        """The measured gradients were multiplied by the device scalar `coef` (the deferred
        clip): the step's sum g^2 follows, and the new gradient versions are the expected ones."""
        carried = self._carried
        if carried is None or carried.squares is None:
            return
        carried.squares = carried.squares * coef.to(carried.squares.device).square()
        carried.grads = [(id(p.grad), _version_of(p.grad)) for p in carried.params]

    def _before_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        """A step about to use the measured gradients: nothing may have written the moments
        since. (Under Lightning the step's closure measures after this hook: then nothing is
        pending here, and `_after_step` checks the gradients alone.)"""
        carried = self._carried
        if carried is None or not carried.valid or carried.squares is None:
            return
        try:
            carried.valid = carried.checked = (
                getattr(optimizer, "grad_scale", None) is None
                and self._measured_grads(carried)
                and _versions(optimizer, carried.params) == carried.versions)
        except Exception:  # never the cause of a failed step: the next measurement sums v
            carried.valid = False

    def _after_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        carried = self._carried
        if carried is None or not carried.valid or carried.squares is None:
            return
        try:
            if getattr(optimizer, "grad_scale", None) is not None or not (
                    carried.checked or self._measured_grads(carried)):
                # the step was given other gradients (a clip after measuring)
                carried.valid = False
                return
            assert carried.beta2 is not None
            updated = carried.sums * carried.beta2 + (1.0 - carried.beta2) * carried.squares
            found_inf = getattr(optimizer, "found_inf", None)
            if isinstance(found_inf, torch.Tensor):  # skipped on the device when it is 1
                updated = torch.where(found_inf.to(updated.device) > 0, carried.sums, updated)
            carried.sums, carried.squares = updated, None
            carried.versions = _versions(optimizer, carried.params)
        except Exception:  # never the cause of a failed step: the next measurement sums v
            carried.valid = False

    @staticmethod
    def _measured_grads(carried: _Carried) -> bool:
        """Each row's gradient is still the tensor measured, unwritten since (Adam reads its
        gradients without writing them)."""
        return [(id(p.grad), _version_of(p.grad)) for p in carried.params] == carried.grads


def _versions(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> list[int]:
    """Each parameter's `exp_avg_sq._version`: bumped by every write in place."""
    return [local_tensor(optimizer.state[p]["exp_avg_sq"])._version for p in params]


def _version_of(grad: torch.Tensor | None) -> int:
    return -1 if grad is None else grad._version


def _update_rms(rows: _Rows, fixed: _Fixed, count: torch.Tensor, correction: torch.Tensor,
                denominator: torch.Tensor, device: torch.device) -> torch.Tensor:
    """sqrt(sum m_hat^2 / sum v_hat) of each row (zeros when some row has no `exp_avg`)."""
    if fixed.beta1 is None:
        return torch.zeros(len(rows.index), dtype=torch.float32, device=device)
    firsts = [m for m in rows.firsts if m is not None]  # every row has one (`_fixed`)
    norms = torch.stack([n.to(device) for n in float32_norms(firsts)])
    first = to_device(1.0 - to_device(fixed.beta1, count.device).pow(count), device)
    return (norms.square() * correction / (first.square() * denominator)).sqrt()


def _l1_norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """sum |v| of each tensor (v >= 0: its sum), accumulated in float32 (float64 on its own):
    one fused pass on an accelerator; on a CPU one sum per tensor, as `_foreach_norm`'s L1
    kernel there is about 6x slower than a sum (measured: 157 against 16 us for the moments of
    a 512-512-10 MLP)."""
    if all(t.device.type == "cpu" for t in tensors):
        return [t.sum().float() if t.dtype == torch.float64 else t.sum(dtype=torch.float32)
                for t in tensors]
    if not any(t.dtype == torch.float64 for t in tensors):
        return list(torch._foreach_norm(tensors, 1, dtype=torch.float32))
    return [t.abs().sum().float() if t.dtype == torch.float64
            else torch._foreach_norm([t], 1, dtype=torch.float32)[0] for t in tensors]


def _step_counts(rows: _Rows, device: torch.device) -> torch.Tensor:
    """Each row's step count t as float32, without reading it on the host (they are CPU tensors
    for most optimizers: one small copy; on the accelerator for capturable and fused ones)."""
    steps = rows.steps
    count = None
    if all(map(torch.is_tensor, steps)):
        # the common case, CPU float32 scalars: one op, checked on its result rather than
        # tensor by tensor (a Python test of each of a GPT-2's 76 counts cost more than it)
        try:
            count = torch.stack(steps)  # type: ignore[arg-type]
        except RuntimeError:  # counts on several devices, or of several shapes
            count = None
        if count is not None and not (count.dtype == torch.float32 and count.dim() == 1
                                      and count.device.type == "cpu"):
            count = None
    if count is None:  # counts on the accelerator (capturable, fused) stay there: no host read
        on_cpu = all(not isinstance(s, torch.Tensor) or s.device.type == "cpu" for s in steps)
        where = torch.device("cpu") if on_cpu else device
        count = torch.stack([s.detach().to(device=where, dtype=torch.float32).reshape(())
                             if isinstance(s, torch.Tensor)
                             else torch.tensor(float(s), device=where) for s in steps])
    return count
