"""Stage 1, `measure`: probe the step on the device and bring everything to the host at once.

The loss, the global and per-parameter gradient norms, the LR, the AMP loss scale, the heavy-probe
results of the sampled step before (queued by `settle`), the batch's statistics on sampled steps
(and while a batch finding lasts) and the recover policy's finite flag all travel in ONE
device-to-host transfer (under torch.distributed, after one small all-reduce that makes every rank
read the same values).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch

from trainguard.diagnose.batch import batch_elements_of
from trainguard.errors import UsageError
from trainguard.events import ActionRecord
from trainguard.pipeline.context import (
    BATCH_KEY,
    TARGET_KEY,
    Measured,
    PackedStep,
    PendingStats,
    StepContext,
)
from trainguard.pipeline.services import Services, new_params_notice
from trainguard.pipeline.state import RunState
from trainguard.probes.logz import LogZProbe
from trainguard.probes.packing import DevicePack
from trainguard.remedies.limit import ClipLimits
from trainguard.signals import SampledStats, StepSignals

log = logging.getLogger("trainguard")

PRECURSOR = "pre:"
"""The pack's prefix of the every-step precursor values (`StepSignals.precursors`)."""
METRIC = "metric:"
"""The prefix of a loop's step metrics handed as device tensors, among the pack's extras."""
LOGZ_PACKED = f"{PRECURSOR}logz_rows"
"""The pack's name of the log Z probe's values, read with `LogZProbe.values`."""


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


def measure(ctx: StepContext, state: RunState, services: Services) -> Measured:
    if ctx.premeasured is not None:  # the calm lane's transfer: what it did not take is here
        if services.step_rng is not None:
            ctx.forward_rng = services.step_rng.take()
        return ctx.premeasured
    step = pack_step(ctx, state, services)
    host = step.pack.fetch()
    limits = state.clip.limits(state.step)  # once a step: `decide` reads them again
    return read_step(ctx, state, services, step, host, limits.in_force(), limits=limits)


def pack_step(ctx: StepContext, state: RunState, services: Services) -> PackedStep:
    """Everything `measure` reads, gathered on the device into one pack (no host read)."""
    config, device = services.config, services.device
    if services.step_rng is not None:
        ctx.forward_rng = services.step_rng.take()
    ctx.new_params = watch_new_params(state, services, ctx.step)
    ranks = services.ranks  # after the parameters it lays out are final
    loss_t = loss_tensor(ctx.loss)
    extra: dict[str, torch.Tensor] = {}
    batch_stats: Any = None
    # a batch finding that may last is followed batch by batch (rank-local, off the
    # all-reduce: it rides the transfer as a plain segment)
    if ctx.batch is not None and config.probes.inspect_batches and (
            ctx.sampled or state.batches.following):
        batch_stats = state.batches.stats_on_device(ctx.batch)
        if batch_stats is not None:
            extra[BATCH_KEY] = batch_stats.tensor
    # the LR backoffs over an LR the loop wrote
    scaled = state.brake.before_measure() if state.brake is not None else []
    recovery = state.recovery
    if recovery is not None:
        scaled += recovery.before_measure()
        extra.update(recovery.extra())
    for said in scaled:
        ctx.act("lr_change", said, written_by_loop=True)
    if state.anchor is not None:
        extra.update(state.anchor.extra())
    if services.target_probe is not None:  # the first steps of a diffusion run
        errors = services.target_probe.take()
        if errors is not None:
            extra[TARGET_KEY] = errors
    for name, value in ctx.metrics.items():  # a loop's metrics still on the device
        if isinstance(value, torch.Tensor):
            extra[f"{METRIC}{name}"] = value.reshape(1).to(device=device, dtype=torch.float32)
    # Under torch.distributed the pack all-reduces loss and gradient norms at fetch.
    fingerprint, ring_wish = False, None
    if ranks is not None:  # the replicas' fingerprint rides this step's all-reduce
        fingerprint = ctx.step % config.distributed.desync_every == 0
        ring_wish = recovery.cadence.wished(ctx.step + 1) if recovery is not None else None
    pack = (DevicePack(device) if ranks is None
            else ranks.step_pack(device, fingerprint=fingerprint, ring_wish=ring_wish))
    if loss_t is not None:
        pack.add("loss", loss_t)
    present, grads, grad_norms, global_norm = services.watch.grad_probe.measure(pack, device)
    lrs = [group.get("lr") for group in services.optimizer.param_groups]
    if any(isinstance(lr, torch.Tensor) for lr in lrs):  # capturable optimizers
        pack.add("lr", torch.stack([torch.as_tensor(
            math.nan if lr is None else lr, dtype=torch.float32, device=device)
            for lr in lrs]))
    scale = getattr(services.scaler, "_scale", None) if services.scaler is not None else None
    if scale is not None:
        pack.add("loss_scale", scale)
    pack_precursors(pack, services, grad_norms, due=(
        config.detectors.instability_precursor.probe and ranks is None and state.precursors_due),
        ratio=state.ratio_due)
    attention = pack_attention(pack, services, ranks is None)
    _carry_forward_probes(ctx, services)
    pending, ctx.carried = ctx.carried, []
    pack_pending(pack, pending)
    for key, tensor in extra.items():
        pack.add(f"x:{key}", tensor)
    return PackedStep(pack=pack, loss=loss_t, global_norm=global_norm, lrs=lrs,
                      pending=pending, extra=list(extra), grads=grads, batch_stats=batch_stats,
                      fingerprint=fingerprint, ring_wish=ring_wish, attention=attention,
                      batch_elements=None if ctx.batch is None else batch_elements_of(ctx.batch),
                      grads_absent=absent_from(present, len(services.watched)))


def pack_precursors(pack: DevicePack, services: Services, grad_norms: torch.Tensor, *,
                    due: bool, ratio: bool = True) -> None:
    """The precursor probes' values (Adam's ratio when `ratio`, log Z) into the pack on a step
    they measure; on a step their cadence skips, log Z's hook leaves nothing to read."""
    if due:
        if ratio:
            for key, tensor in services.watch.adam_probe.measure(services.device,
                                                                  grad_norms).items():
                pack.add(f"{PRECURSOR}{key}", tensor)
        logz = services.logz_probe.take() if services.logz_probe is not None else None
        if logz is not None:
            pack.add(LOGZ_PACKED, logz)
    elif services.logz_probe is not None:
        services.logz_probe.take()


def precursors_of(host: dict[str, np.ndarray], logz: LogZProbe | None
                  ) -> dict[str, np.ndarray]:
    """The precursor probes' values among a step's host arrays, by signal name (`logz`: the
    probe whose values the pack carries, which reads them)."""
    found = {k[len(PRECURSOR):]: v for k, v in host.items()
             if k.startswith(PRECURSOR) and k != LOGZ_PACKED}
    rows = host.get(LOGZ_PACKED)
    if rows is not None and logz is not None:
        found.update(logz.values(rows))
    return found


def absent_from(present: list[int], watched: int) -> tuple[int, ...]:
    """The indices in `range(watched)` missing from `present` (sorted); the usual step has
    every gradient and pays one comparison."""
    if len(present) == watched:
        return ()
    return tuple(sorted(set(range(watched)).difference(present)))


def read_step(ctx: StepContext, state: RunState, services: Services, step: PackedStep,
              host: dict[str, np.ndarray], limit: float | None, *,
              limits: ClipLimits | None = None) -> Measured:
    """The step's measurement from the pack's host copy; `limit`: the clip limit in force when
    it was measured, of `limits` when they are given (what `decide` reads again)."""
    signals = _signals(ctx, state, services, host, step)
    signals.batch_elements = step.batch_elements
    signals.grads_absent = step.grads_absent
    signals.clip_limit = limit
    if step.attention:
        signals.attention_logits = dict(zip(step.attention, (
            float(v) for v in host[ATTENTION]), strict=True))
    return Measured(signals=signals, grads=step.grads,
                    extra={key: host[f"x:{key}"] for key in step.extra},
                    batch_stats=step.batch_stats, limits=limits)


def watch_new_params(state: RunState, services: Services, step: int) -> ActionRecord | None:
    """Parameters the optimizer gained since the last step are watched, clipped and skipped from
    this step on; returns the notice for the sinks (None when nothing was added)."""
    added = services.watch.gained()
    if added is None:
        return None
    recovery = state.recovery
    if recovery is not None:  # good states hold the old parameter groups: start afresh
        recovery.ring.discard_after(-1)
        recovery.start(state.step, state.rewind_state())
    if state.anchor is not None:
        state.anchor.restart(state.step)
    return new_params_notice(added, step, len(services.watched))


def _carry_forward_probes(ctx: StepContext, services: Services) -> None:
    """The forward pass's activation and output statistics (sampled steps) join the pending
    heavy-probe results that ride this step's transfer."""
    activations, outputs = services.activation_probe, services.output_probe
    seen = (activations.detach() if activations is not None and activations.attached
            else None)
    predicted = outputs.detach() if outputs is not None and outputs.attached else None
    if seen is not None or predicted is not None:
        ctx.carried.append(PendingStats(
            step=ctx.step, module_names=seen[0] if seen else [],
            per_module=seen[1] if seen else {}, output=predicted or {}))


def _signals(ctx: StepContext, state: RunState, services: Services,
             host: dict[str, np.ndarray], step: PackedStep) -> StepSignals:
    lrs = step.lrs
    loss_value = float(host["loss"][0]) if "loss" in host else None
    grad_norm = float(host["grad_norm"][0])
    loss_finite = loss_value is None or math.isfinite(loss_value)
    group_lrs = (tuple(float(v) for v in host["lr"]) if "lr" in host
                 else tuple(math.nan if lr is None else float(lr) for lr in lrs))
    ranks, scaler = services.ranks, services.scaler
    return StepSignals(
        step=ctx.step, loss=loss_value, grad_norm=grad_norm,
        param_grad_norm=host["param_grad_norm"], param_names=services.watched.names,
        lr=None if lrs[0] is None else group_lrs[0], group_lrs=group_lrs,
        lr_managed=state.recovery is not None and state.recovery.lr.active,
        loss_curvature=state.curvature.observe(loss_value),
        loss_scale=float(host["loss_scale"][0]) if "loss_scale" in host else None,
        amp_overflow=scaler is not None and loss_finite and not math.isfinite(grad_norm),
        fp16_grad_maxabs=(float(host["fp16_grad_maxabs"][0]) if "fp16_grad_maxabs" in host
                          else None),
        sampled=unpack_pending(host, step.pending),
        precursors=precursors_of(host, services.logz_probe),
        trainer_metrics={name: (float(host[f"x:{METRIC}{name}"][0])
                                if isinstance(value, torch.Tensor) else value)
                         for name, value in ctx.metrics.items()},
        loss_requires_grad=(ctx.loss.requires_grad if isinstance(ctx.loss, torch.Tensor)
                            else None),
        ranks=(ranks.rank_view(host["ranks"], step.fingerprint,
                               wished=step.ring_wish is not None)
               if ranks is not None and "ranks" in host else None))


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


def flush_pending(state: RunState, services: Services,
                  pending: list[PendingStats]) -> StepSignals | None:
    """At the end of a run: the last heavy-probe results, brought over in one transfer."""
    if not pending:
        return None
    pack = DevicePack(services.device)
    pack_pending(pack, pending)
    watched = services.watched
    return StepSignals(step=state.step, loss=None, grad_norm=0.0,
                       param_grad_norm=np.zeros(len(watched)), param_names=watched.names,
                       sampled=unpack_pending(pack.fetch(), pending))


ATTENTION = "att:attn_logit_max"
"""The pack's segment of the attention layers' largest logits."""


def pack_attention(pack: DevicePack, services: Services, keep: bool) -> list[str]:
    """The attention probe's values of this step's forward pass, when it was hooked, into the
    pack (`keep`: not under torch.distributed, where they are rank-local and the precursor is
    left out); the layer names, in the pack's order."""
    probe = services.attention_probe
    if probe is None or not probe.attached:
        return []
    try:  # at a cadence of every step the hooks stay for the next forward
        seen = (probe.collect() if services.config.detectors.attention_logits.every == 1
                else probe.detach())
    except Exception as exc:  # the probe is advisory: the step goes on without its values
        log.error("trainguard: attention probe failed (%s: %s)", type(exc).__name__, exc)
        return []
    if seen is None or not keep:
        return []
    pack.add(ATTENTION, seen[1])
    return seen[0]
