"""What each rank runs in the distributed tests: real DDP and FSDP2 training under a Guard.

Every function is called as `fn(rank, world, ...)` inside an initialised gloo process group and
returns plain data (lists, dicts, floats) for the test to compare across ranks.
"""

from __future__ import annotations

import copy
import math
import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from trainguard import Guard, GuardConfig, PeerLost, TrainingDiverged
from trainguard.transfer import transfer_count

IN_FEATURES = 8


def mlp(seed: int = 0, width: int = 16) -> nn.Sequential:
    """The same initial weights on every rank."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN_FEATURES, width), nn.Tanh(), nn.Linear(width, 1))


def regression_batch(rank: int, step: int, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """A smooth regression task; each rank draws its own samples."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(size, IN_FEATURES, generator=generator)
    y = torch.tanh(x[:, :4].sum(dim=1, keepdim=True)) + 0.5 * x[:, 4:5]
    return x, y


def flat_weights(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()]).tolist()


def event_view(report: Any) -> list[tuple[str, str, int]]:
    return [(e.kind, e.severity, e.step) for e in report.events]


def ddp_nonfinite_on_one_rank(rank: int, world: int, run_dir: str) -> dict[str, Any]:
    """Rank 1 alone meets a non-finite loss at steps 4, 7 and 9 (each of a different kind)."""
    model = DistributedDataParallel(mlp())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False}), run_dir=run_dir)
    actions, losses, events, transfers, messages = [], [], [], [], []
    for step in range(12):
        x, y = regression_batch(rank, step)
        if step == 4 and rank == 1:
            x[3, 2] = math.nan  # a poisoned sample: NaN loss, and NaN gradients after all-reduce
        loss = F.mse_loss(model(x), y)
        if step == 7 and rank == 1:
            loss = loss + math.inf  # inf loss with finite gradients: rank 0 sees nothing itself
        if step == 9:
            loss = loss + (math.inf if rank == 1 else -math.inf)  # opposite infinities
        loss.backward()
        before = transfer_count()
        report = guard.step(loss)
        transfers.append(transfer_count() - before)
        optimizer.zero_grad(set_to_none=True)
        actions.append(report.action)
        losses.append(report.loss)
        events.append(event_view(report))
        messages.append([(e.kind, e.message, e.details.get("ranks")) for e in report.events])
    guard.close()
    state = optimizer.state_dict()["state"]
    return {"actions": actions, "losses": losses, "events": events, "transfers": transfers,
            "messages": messages,
            "weights": flat_weights(model),
            "adam_steps": sorted({float(s["step"]) for s in state.values()}),
            "has_store": guard.run.store is not None,
            "context": (guard.run.dist.rank, guard.run.dist.world_size,
                        str(guard.run.dist.device), guard.run.dist.is_main)}


def ddp_deferred(rank: int, world: int, sync: str) -> dict[str, Any]:
    """`ddp_nonfinite_on_one_rank`'s faults with a fused AdamW and a fixed clip, under `sync`:
    at step 7 only rank 1's loss is inf (its gradients are finite), so only the flag reduced
    across ranks tells rank 0 to skip."""
    from trainguard.transfer import blocking_transfer_count

    model = DistributedDataParallel(mlp())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    guard = Guard(model, optimizer, config=GuardConfig(sync=sync,  # type: ignore[arg-type]
                                                       sinks={"console": False},
                                                       clip={"max_grad_norm": 0.5}))
    reports, blocking = [], []
    for step in range(12):
        x, y = regression_batch(rank, step)
        if step == 4 and rank == 1:
            x[3, 2] = math.nan
        loss = F.mse_loss(model(x), y)
        if step == 7 and rank == 1:
            loss = loss + math.inf
        if step == 9:
            loss = loss + (math.inf if rank == 1 else -math.inf)
        loss.backward()
        before = blocking_transfer_count()
        report = guard.step(loss)
        blocking.append(blocking_transfer_count() - before)
        optimizer.zero_grad(set_to_none=True)
        if report is not None:
            reports.append((report.step, report.action, report.clip_coef, event_view(report)))
    guard.close()
    state = optimizer.state_dict()["state"]
    return {"reports": reports, "blocking": blocking, "deferred": guard.run.deferred,
            "events": [(e.kind, e.step) for e in guard.events],
            "weights": flat_weights(model),
            "adam_steps": sorted({float(s["step"]) for s in state.values()})}


def fsdp2_deferred(rank: int, world: int, sync: str) -> dict[str, Any]:
    """FSDP2 with a fused AdamW and a fixed clip under `sync`: the clip factor comes from the
    shards' norms agreed across ranks; at step 3 only rank 1's loss is NaN."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3))
    fully_shard(model[0])
    fully_shard(model[2])
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    guard = Guard(model, optimizer, config=GuardConfig(sync=sync,  # type: ignore[arg-type]
                                                       sinks={"console": False},
                                                       clip={"max_grad_norm": 0.3}))
    reports = []
    for step in range(8):
        gen = torch.Generator().manual_seed(10 * step + rank)
        x, y = torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen)
        loss = F.mse_loss(model(x), y)
        if step == 3 and rank == 1:
            loss = loss + math.inf
        loss.backward()
        report = guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
        if report is not None:
            reports.append((report.step, report.action, report.clip_coef))
    guard.close()
    local = [p.to_local().detach().reshape(-1) if hasattr(p, "to_local") else p.detach()
             for p in model.parameters()]
    return {"reports": reports, "deferred": guard.run.deferred,
            "weights": torch.cat([t.reshape(-1).double() for t in local]).tolist()}


def ddp_deferred_on_one_rank_only(rank: int, world: int) -> dict[str, Any]:
    """Rank 1's optimizer cannot skip on the device: every rank then runs blocking."""
    model = DistributedDataParallel(mlp())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=rank == 0)
    guard = Guard(model, optimizer, config=GuardConfig(sync="deferred", sinks={"console": False}))
    actions = []
    for step in range(4):
        x, y = regression_batch(rank, step)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        actions.append(guard.step(loss).action)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    return {"deferred": guard.run.deferred, "actions": actions}


def ddp_nan_batch_on_one_rank(rank: int, world: int, batch_from: int | None = 6,
                              loss_from: int | None = None) -> dict[str, Any]:
    """Rank 1 alone: a NaN in its batch at step `batch_from`, or a NaN loss from a clean batch
    at step `loss_from`. Every rank hands its batch to the Guard."""
    model = DistributedDataParallel(mlp())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False}))
    messages = []
    for step in range(12):
        x, y = regression_batch(rank, step)
        if rank == 1 and step == batch_from:
            x[3, 2] = math.nan
        loss = F.mse_loss(model(x), y)
        if rank == 1 and step == loss_from:
            loss = loss * math.nan  # a fault of the computation (the batch is clean)
        loss.backward()
        report = guard.step(loss, batch={"x": x, "y": y})
        optimizer.zero_grad(set_to_none=True)
        messages.extend((e.step, e.kind, e.message, e.details.get("ranks"),
                         e.details.get("batch")) for e in report.events)
    diagnosis = [(c.code, c.confidence, c.evidence) for c in guard.diagnose()]
    guard.close()
    return {"messages": messages, "diagnosis": diagnosis, "weights": flat_weights(model)}


def ddp_spike_on_one_rank(rank: int, world: int, spike_step: int, snapshot_dir: str,
                          lasting: bool = False) -> dict[str, Any]:
    """Rank 1 alone gets batches with targets 40x at `spike_step`, under the halt policy: one
    outlier batch, or (`lasting`) every batch from then on, as a bad shard would.

    Rank 0's own loss stays calm: it can only act with rank 1 if it sees the spike too.
    """
    model = DistributedDataParallel(mlp(seed=1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    config = GuardConfig(policy="halt", sinks={"console": False}, clip={"max_grad_norm": None},
                         checkpoints={"snapshot_dir": f"{snapshot_dir}/rank{rank}"})
    guard = Guard(model, optimizer, config=config)
    own_losses, losses, actions = [], [], []
    halt: dict[str, Any] | None = None
    for step in range(spike_step + 3):
        x, y = regression_batch(rank, step)
        if rank == 1 and (step == spike_step or (lasting and step > spike_step)):
            y = y * 40.0
        own = F.mse_loss(model(x), y)
        own.backward()
        own_losses.append(own.item())
        try:
            report = guard.step(own)
        except TrainingDiverged as exc:
            assert exc.report is not None
            halt = {"step": exc.report.step, "loss": exc.report.loss,
                    "events": [(e.kind, e.severity, e.step, e.message) for e in exc.events]}
            break
        optimizer.zero_grad(set_to_none=True)
        actions.append(report.action)
        losses.append(report.loss)
    guard.close()
    return {"own_losses": own_losses, "losses": losses, "actions": actions, "halt": halt,
            "weights": flat_weights(model),
            "events": [(e.kind, e.severity, e.step, e.message) for e in guard.events]}


def fsdp2_global_norm(rank: int, world: int, run_dir: str, max_grad_norm: float) -> dict[str, Any]:
    """FSDP2 (fully_shard) on unevenly split layers next to an unsharded copy on the full data.

    FSDP2 averages gradients over ranks, so the copy's loss is the mean of the ranks' losses.
    """
    from torch.distributed.fsdp import fully_shard

    reference = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3))
    torch.manual_seed(0)
    for p in reference.parameters():
        nn.init.normal_(p, std=0.5)
    model = copy.deepcopy(reference)
    fully_shard(model[0])
    fully_shard(model[2])
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False},
                                                       clip={"max_grad_norm": max_grad_norm},
                                                       probes={"sample_every": 2}),
                  run_dir=run_dir)
    norms, ref_norms, ref_param_norms, losses, ref_losses, actions = [], [], [], [], [], []
    ref_maxabs, ref_weight_norms = [], []
    for step in range(4):
        data = [(torch.randn(8, 6, generator=torch.Generator().manual_seed(10 * step + r)),
                 torch.randn(8, 3, generator=torch.Generator().manual_seed(500 + 10 * step + r)))
                for r in range(world)]
        x, y = data[rank]
        loss = F.mse_loss(model(x), y)
        loss.backward()
        report = guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
        norms.append(report.grad_norm)
        losses.append(report.loss)
        actions.append(report.action)

        ref_loss = sum(F.mse_loss(reference(xr), yr) for xr, yr in data) / world
        ref_loss.backward()
        ref_param_norms.append([float(p.grad.norm()) for p in reference.parameters()])
        ref_norms.append(float(nn.utils.clip_grad_norm_(reference.parameters(), max_grad_norm)))
        ref_optimizer.step()
        ref_optimizer.zero_grad(set_to_none=True)
        ref_losses.append(float(ref_loss))
        ref_maxabs.append([float(p.detach().abs().max()) for p in reference.parameters()])
        ref_weight_norms.append([float(p.detach().norm()) for p in reference.parameters()])
    guard.close()
    full = [p.full_tensor().detach() for p in model.parameters()]
    weight_gap = max(float((a - b).abs().max()) for a, b in zip(full, reference.parameters(),
                                                                strict=True))
    local_shapes = [tuple(p.to_local().shape) for p in model.parameters()]
    return {"norms": norms, "ref_norms": ref_norms, "ref_param_norms": ref_param_norms,
            "losses": losses, "ref_losses": ref_losses, "actions": actions,
            "weight_gap": weight_gap, "local_shapes": local_shapes,
            "ref_maxabs": ref_maxabs, "ref_weight_norms": ref_weight_norms,
            "names": guard.run.watched.names}


def ddp_desync(rank: int, world: int, run_dir: str, param: str) -> dict[str, Any]:
    """Rank 1 nudges one element of `param` after step 5; the check runs every 4 steps. Under
    `observe`, so that the run goes on and the check reports the drift once."""
    model = DistributedDataParallel(mlp(seed=2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = Guard(model, optimizer, config=GuardConfig(policy="observe", sinks={"console": False},
                                                       distributed={"desync_every": 4}),
                                                       run_dir=run_dir)
    for step in range(13):
        x, y = regression_batch(rank, step)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
        if step == 5 and rank == 1:
            with torch.no_grad():
                dict(model.named_parameters())[param].view(-1)[0] += 1e-4
    guard.close()
    desync = [e for e in guard.events if e.kind == "ddp_desync"]
    context = guard.run.dist
    assert context is not None
    return {"events": [(e.step, e.severity, e.param, e.details["params"], e.details["ranks"],
                        e.details["cause"], e.value) for e in desync],
            "has_store": guard.run.store is not None,
            "agree_max": context.agree_max(3 * rank + 1)}


def agreement_paths(rank: int, world: int) -> dict[str, Any]:
    """The step pack's two paths (all-reduce before the transfer, or after it on the host) on
    gradients that differ across ranks (no DDP), with rank 1's loss +inf, then absent."""
    from trainguard.pipeline import Run

    model = mlp(seed=3)
    run = Run(model, torch.optim.SGD(model.parameters(), lr=0.1),
              config=GuardConfig(sinks={"console": False}))
    assert run.ranks is not None
    x, y = regression_batch(rank, 0)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    losses = {"inf_on_rank1": loss.detach() + (math.inf if rank == 1 else 0.0),
              "rank0_only": loss.detach() if rank == 0 else None}
    out: dict[str, Any] = {"own_loss": loss.item(),
                           "own_norms": [float(p.grad.norm()) for p in model.parameters()]}
    for case, value in losses.items():
        for on_host in (False, True):
            pack = run.ranks.step_pack(run.device, on_host=on_host)
            if value is not None:
                pack.add("loss", value)
            run.grad_probe.measure(pack, run.device)
            pack.add("lr", torch.tensor([0.25 + rank]))
            before = transfer_count()
            host = pack.fetch()
            out[f"{case}:{on_host}"] = {k: v.tolist() for k, v in host.items()}
            out[f"{case}:{on_host}:transfers"] = transfer_count() - before
    run.close()
    return out


def ddp_recover_on_one_rank(rank: int, world: int) -> dict[str, Any]:
    """Policy recover. Rank 1 alone has a NaN in an unused batch field on the sampled steps 5 and
    10 (a batch finding of that rank only, right when a good-state candidate is confirmed), and
    a non-finite loss from clean batches at steps 25-27, which rolls the run back."""
    from trainguard import RecoveryConfig

    model = DistributedDataParallel(mlp())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    config = GuardConfig(policy="recover", recovery=RecoveryConfig(ring_every=5, confirm_steps=2,
                                                 rollback_after_skips=3), sinks={"console": False},
                                                 probes={"sample_every": 5})
    guard = Guard(model, optimizer, config=config)
    actions, events, batch_events = [], [], []
    for step in range(40):
        x, y = regression_batch(rank, step)
        aux = torch.zeros(4)
        if rank == 1 and step in (5, 10):
            aux[0] = math.nan
        loss = F.mse_loss(model(x), y)
        if rank == 1 and step in (25, 26, 27):
            loss = loss * math.nan  # a fault of the computation (the batch is clean)
        loss.backward()
        report = guard.step(loss, batch={"x": x, "y": y, "aux": aux})
        optimizer.zero_grad(set_to_none=True)
        actions.append(report.action)
        events.append([(e.kind, e.step, e.details.get("to_step")) for e in report.events
                       if not e.kind.startswith("batch_")])
        batch_events.extend((e.kind, e.step) for e in report.events
                            if e.kind.startswith("batch_"))
    guard.close()
    return {"actions": actions, "events": events, "weights": flat_weights(model),
            "ring": [s.step for s in guard.recovery.ring.good], "batch_events": batch_events}


def ddp_recover_deferred(rank: int, world: int, sync: str) -> dict[str, Any]:
    """`ddp_recover_on_one_rank`'s faults (rank 1 alone: a NaN in an unused batch field at the
    sampled steps 5 and 10, a non-finite loss from clean batches at steps 25-27) with a fused
    AdamW, a fixed ring cadence and `sync`. The weights are kept after every call."""
    from trainguard import RecoveryConfig
    from trainguard.transfer import blocking_transfer_count

    model = DistributedDataParallel(mlp())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    config = GuardConfig(policy="recover", sync=sync,  # type: ignore[arg-type]
                         recovery=RecoveryConfig(ring_every=5, confirm_steps=2, ring_budget=None,
                                                 rollback_after_skips=3), sinks={"console": False},
                                                 probes={"sample_every": 5},
                                                 clip={"max_grad_norm": 0.5})
    guard = Guard(model, optimizer, config=config)
    reports, weights, blocking = [], [], []
    for step in range(40):
        x, y = regression_batch(rank, step)
        aux = torch.zeros(4)
        if rank == 1 and step in (5, 10):
            aux[0] = math.nan
        loss = F.mse_loss(model(x), y)
        if rank == 1 and step in (25, 26, 27):
            loss = loss * math.nan  # a fault of the computation (the batch is clean)
        loss.backward()
        before = blocking_transfer_count()
        report = guard.step(loss, batch={"x": x, "y": y, "aux": aux})
        blocking.append(blocking_transfer_count() - before)
        optimizer.zero_grad(set_to_none=True)
        weights.append(flat_weights(model))
        if report is not None:
            reports.append((report.step, report.action))
    guard.close()
    assert guard.recovery is not None
    return {"reports": reports, "weights": weights, "deferred": guard.run.deferred,
            "blocking": blocking,
            "events": [(e.kind, e.step, e.details.get("to_step")) for e in guard.events
                       if not e.kind.startswith("batch_")],
            "ring": [s.step for s in guard.recovery.ring.good],
            "rolled_back_steps": guard.recovery.rolled_back_steps}


def ddp_desync_under_policy(rank: int, world: int, policy: str, nudge_after: int = 5,
                            desync_every: int | None = 4, steps: int = 16,
                            snapshot_dir: str | None = None) -> dict[str, Any]:
    """Rank 1 nudges a weight after step `nudge_after`; the check runs every `desync_every`
    steps (None: the default), before the step's decision. `halt` and `protect` must stop both
    ranks at the first check after the nudge; `recover` must roll both back to the state from
    before the drift, after which the replicas agree again."""
    from trainguard import RecoveryConfig

    model = DistributedDataParallel(mlp(seed=2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    every = {} if desync_every is None else {"desync_every": desync_every}
    config = GuardConfig(policy=policy, recovery=RecoveryConfig(ring_every=4, confirm_steps=1),
                         sinks={"console": False}, checkpoints={"snapshot_dir": snapshot_dir},
                         **every)
    guard = Guard(model, optimizer, config=config)
    actions: list[str] = []
    halted_at = None
    for step in range(steps):
        x, y = regression_batch(rank, step)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        try:
            actions.append(guard.step(loss).action)
        except TrainingDiverged as exc:
            halted_at = exc.report.step if exc.report is not None else None
            break
        optimizer.zero_grad(set_to_none=True)
        if step == nudge_after and rank == 1:
            with torch.no_grad():
                model.module[0].bias.view(-1)[0] += 1e-4
    guard.close()
    return {"actions": actions, "halted_at": halted_at, "weights": flat_weights(model),
            "events": [(e.kind, e.step, e.details.get("to_step")) for e in guard.events
                       if e.kind in ("ddp_desync", "rollback", "rollback_limit")]}


def peer_killed(rank: int, world: int, run_dir: str, kill_at: int, timeout_s: float,
                how: str = "SIGKILL") -> dict[str, Any]:
    """Two ranks whose only collective is trainguard's; rank 1 sends itself `how` (SIGKILL: it
    dies; SIGSTOP: it hangs) at step `kill_at`. Rank 0 reports how it stopped, and how long
    after rank 1 went."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    guard = Guard(model, optimizer, run_dir=run_dir,
                  config=GuardConfig(sinks={"console": False},
                                     distributed={"collective_timeout_s": timeout_s}))
    store = dist.distributed_c10d._get_default_store()
    step, deadline = 0, time.monotonic() + 60  # unguarded, rank 0 would train on for ever
    try:
        while time.monotonic() < deadline:
            x, y = regression_batch(rank, step)
            loss = F.mse_loss(model(x), y)
            loss.backward()
            if rank == 1 and step == kill_at:
                store.set("test/killed_at", str(time.time()))
                os.kill(os.getpid(), getattr(signal, how))
            guard.step(loss)
            optimizer.zero_grad(set_to_none=True)
            step += 1
        guard.close()
        return {"error": None, "steps": step, "events": len(guard.events)}
    except PeerLost as exc:
        after = time.time() - float(store.get("test/killed_at").decode())
        again = None
        try:  # a later step says the same, not "trainguard is closed"
            guard.step(F.mse_loss(model(x), y))
        except PeerLost as second:
            again = str(second)
        return {"error": str(exc), "ranks": exc.ranks, "step": exc.step, "after_s": after,
                "steps": step, "closed": guard.run.closed, "again": again,
                "events": [(e.kind, e.severity) for e in guard.events]}
