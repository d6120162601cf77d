"""Stage 1, `measure`: probe the step on the device and bring everything to the host at once.

The loss, the global and per-parameter gradient norms, the LR, the AMP loss scale, the heavy-probe
results of the sampled step before (queued by `settle`), the batch's statistics on sampled steps
(and while a batch finding lasts) and the recover policy's finite flag all travel in ONE
device-to-host transfer (under torch.distributed, after one small all-reduce that makes every rank
read the same values).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from trainguard.errors import UsageError
from trainguard.pipeline.context import PendingStats, StepContext
from trainguard.probes.packing import DevicePack
from trainguard.signals import SampledStats, StepSignals

if TYPE_CHECKING:
    from trainguard.pipeline.run import Run

BATCH_KEY = "batch"
"""Name of the batch statistics among the extra tensors of the step's transfer."""


def loss_tensor(loss: Any) -> torch.Tensor | None:
    """Validate the loss a user passed: a scalar tensor, a number or None."""
    if loss is None:
        return None
    if isinstance(loss, torch.Tensor):
        if loss.dtype == torch.float32 and loss.dim() == 0:  # the usual case, cheaply
            return loss.detach()
        if loss.numel() != 1:
            raise UsageError(f"the loss must be a scalar, got a tensor of shape "
                             f"{tuple(loss.shape)}: reduce it (for example loss.mean()) first")
        if not (loss.is_floating_point() or loss.is_complex()):
            loss = loss.float()
        return loss.detach().reshape(())
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return torch.tensor(float(loss))
    raise UsageError(f"the loss must be a scalar tensor or a number, got {type(loss).__name__}")


class Measure:
    name = "measure"

    def __init__(self, run: Run) -> None:
        self.run = run

    def __call__(self, ctx: StepContext) -> None:
        run = self.run
        ctx.new_params = run.watch_new_params(ctx.step)
        loss_t = loss_tensor(ctx.loss)
        extra: dict[str, torch.Tensor] = {}
        # a batch finding that may last is followed batch by batch (rank-local, off the
        # all-reduce: it rides the transfer as a plain segment)
        if ctx.batch is not None and run.config.inspect_batches and (
                ctx.sampled or run.batches.following):
            ctx.batch_stats = run.batches.stats_on_device(ctx.batch)
            if ctx.batch_stats is not None:
                extra[BATCH_KEY] = ctx.batch_stats.tensor
        if run.state.recovery is not None:
            run.state.recovery.before_measure()  # the LR backoff over an LR the loop wrote
            extra.update(run.state.recovery.extra())
        # Under torch.distributed the pack all-reduces loss and gradient norms at fetch.
        if run.ranks is not None:  # the replicas' fingerprint rides this step's all-reduce
            ctx.fingerprint = ctx.step % run.config.desync_every == 0
            recovery = run.state.recovery
            ctx.ring_wish = (recovery.cadence.wished(ctx.step + 1) if recovery is not None
                             else None)
        pack = (DevicePack(run.device) if run.ranks is None
                else run.ranks.step_pack(run.device, fingerprint=ctx.fingerprint,
                                         ring_wish=ctx.ring_wish))
        if loss_t is not None:
            pack.add("loss", loss_t)
        _, ctx.grads, _ = run.grad_probe.measure(pack, run.device)
        lrs = [group.get("lr") for group in run.optimizer.param_groups]
        if any(isinstance(lr, torch.Tensor) for lr in lrs):  # capturable optimizers
            pack.add("lr", torch.stack([torch.as_tensor(
                math.nan if lr is None else lr, dtype=torch.float32, device=run.device)
                for lr in lrs]))
        scale = getattr(run.scaler, "_scale", None) if run.scaler is not None else None
        if scale is not None:
            pack.add("loss_scale", scale)
        activations, outputs = run.activation_probe, run.output_probe
        seen = (activations.detach() if activations is not None and activations.attached
                else None)
        predicted = outputs.detach() if outputs is not None and outputs.attached else None
        if seen is not None or predicted is not None:
            ctx.carried.append(PendingStats(
                step=ctx.step, module_names=seen[0] if seen else [],
                per_module=seen[1] if seen else {}, output=predicted or {}))
        pending, ctx.carried = ctx.carried, []
        pack_pending(pack, pending)
        for key, tensor in extra.items():
            pack.add(f"x:{key}", tensor)
        host = pack.fetch()

        loss_value = float(host["loss"][0]) if "loss" in host else None
        grad_norm = float(host["grad_norm"][0])
        loss_finite = loss_value is None or math.isfinite(loss_value)
        group_lrs = (tuple(float(v) for v in host["lr"]) if "lr" in host
                     else tuple(math.nan if lr is None else float(lr) for lr in lrs))
        ctx.signals = StepSignals(
            step=ctx.step, loss=loss_value, grad_norm=grad_norm,
            param_grad_norm=host["param_grad_norm"], param_names=run.watched.names,
            lr=None if lrs[0] is None else group_lrs[0], group_lrs=group_lrs,
            lr_managed=run.state.recovery is not None and run.state.recovery.lr.active,
            loss_curvature=run.state.curvature.observe(loss_value),
            loss_scale=float(host["loss_scale"][0]) if "loss_scale" in host else None,
            amp_overflow=run.scaler is not None and loss_finite and not math.isfinite(grad_norm),
            fp16_grad_maxabs=(float(host["fp16_grad_maxabs"][0]) if "fp16_grad_maxabs" in host
                              else None),
            sampled=unpack_pending(host, pending),
            loss_requires_grad=(ctx.loss.requires_grad if isinstance(ctx.loss, torch.Tensor)
                                else None),
            ranks=(run.ranks.rank_view(host["ranks"], ctx.fingerprint,
                                       wished=ctx.ring_wish is not None)
                   if run.ranks is not None and "ranks" in host else None))
        ctx.extra = {key: host[f"x:{key}"] for key in extra}


def pack_pending(pack: DevicePack, pending: list[PendingStats]) -> None:
    for i, item in enumerate(pending):
        for key, tensor in item.per_param.items():
            pack.add(f"p{i}:{key}", tensor)
        for key, tensor in item.per_module.items():
            pack.add(f"m{i}:{key}", tensor)
        for key, tensor in item.output.items():
            pack.add(f"o{i}:{key}", tensor)


def unpack_pending(host: dict[str, np.ndarray],
                   pending: list[PendingStats]) -> list[SampledStats]:
    return [SampledStats(step=item.step,
                         per_param={k: host[f"p{i}:{k}"] for k in item.per_param},
                         module_names=item.module_names,
                         per_module={k: host[f"m{i}:{k}"] for k in item.per_module},
                         output={k: float(host[f"o{i}:{k}"][0]) for k in item.output})
            for i, item in enumerate(pending)]


def flush_pending(run: Run, pending: list[PendingStats]) -> StepSignals | None:
    """At the end of a run: the last heavy-probe results, brought over in one transfer."""
    if not pending:
        return None
    pack = DevicePack(run.device)
    pack_pending(pack, pending)
    return StepSignals(step=run.state.step, loss=None, grad_norm=0.0,
                       param_grad_norm=np.zeros(len(run.watched)),
                       param_names=run.watched.names, sampled=unpack_pending(pack.fetch(),
                                                                             pending))
