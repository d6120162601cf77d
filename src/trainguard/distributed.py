"""trainguard under torch.distributed (DDP, FSDP2): one decision for all ranks.

Every rank runs its own Engine. Left alone, each would see only its own loss and, under FSDP2,
only its own shard of each gradient: a NaN loss on one rank would skip the step there and apply it
elsewhere, and the replicas would part. Here:

- `DistributedContext`: rank, world size and the device collectives use. It exists only when a
  process group of more than one rank is initialised, so single-process runs pay nothing.
- `RankAgreement.step_pack`: one all-reduce per step, of one small float64 vector, right before
  the Engine's one device-to-host transfer (or right after it, on the host, when a gloo group
  serves a model on an accelerator). Every rank then reads the same loss (the mean over ranks,
  NaN/inf on any rank showing on all), the same per-parameter and global gradient norms (those of
  the unsharded gradients under FSDP2), so detectors and the policy decide alike everywhere.
- `LocalShardGradientProbe`: measures the local shard of a sharded (DTensor) gradient, whose
  squared norms the all-reduce adds up.
- `RankAgreement.check_desync` (guide §3.4.1): cheap per-parameter fingerprints of the replicated
  weights, gathered from every rank and compared; names the parameters that drifted apart.
- `RankAgreement.gather_batches`: on a step whose agreed signals raised trouble, every rank's
  batch findings, so that the diagnosis hears them with their rank.
- `DistributedContext.agree_max`: for a decision a driver takes from rank-local data.
- `PeerLink`: every collective above goes through it, on a gloo group of trainguard's own with
  `GuardConfig.distributed.collective_timeout_s`. The first one that fails (a rank died, or hung
  past the timeout) ends the agreement for good: a roll call through the process group's store names
  the rank(s) gone, and `PeerLost` stops the run on every rank left.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from trainguard.errors import PeerLost, UsageError
from trainguard.events import Event
from trainguard.params import WatchedParams
from trainguard.probes.gradients import GradientProbe
from trainguard.probes.local import local_tensor
from trainguard.probes.packing import DevicePack, Finish, PendingPack
from trainguard.registry import Reduction, Scope, metric_key
from trainguard.transfer import to_host

log = logging.getLogger("trainguard")

DESYNC_RTOL = 1e-12
"""Fingerprints of a parameter differ when they part by more than this, relative to its norm.
Replicas kept in sync are bitwise equal; float64 fingerprints of equal weights differ by ~1e-16
at most (a different summation order), while one float32 ulp in one of 1000 weights is ~6e-11."""

# Layout of the vector each rank contributes to the step's all-reduce: the head, then four
# blocks of one slot per rank (each rank writes only its own slot, so the sum is every rank's
# value), then the per-parameter norms.
_LOSS, _LOSS_RANKS, _LOSS_NONFINITE, _FP16, _FP16_RANKS, _HEAD = range(6)
_RANK_LOSS, _RANK_LOSS_BAD, _RANK_GRAD_BAD, _RANK_PRINT, _RANK_WISH, _RANK_BLOCKS = range(6)


@dataclass(frozen=True, slots=True)
class RankView:
    """What each rank contributed to one step's all-reduce, identical on every rank: its own
    loss, whether its loss or its local gradients were non-finite, and on fingerprint steps a
    fingerprint of its replicated weights. Names the rank a fault came from."""

    loss: np.ndarray
    loss_nonfinite: np.ndarray
    grad_nonfinite: np.ndarray
    drift: np.ndarray | None
    """On a fingerprint step (`GuardConfig.distributed.desync_every`): each rank's weight
    fingerprint against rank 0's, relative (0 when the replicas agree); None on other steps."""
    ring_wish: np.ndarray | None = None
    """Under `recover`: the good-state interval each rank's measured costs ask for."""

    def ranks_where(self, flags: np.ndarray) -> list[int]:
        return [int(r) for r in np.flatnonzero(flags)]

    def drifted(self) -> list[int]:
        """The ranks whose replicated weights differ from rank 0's."""
        if self.drift is None:
            return []
        return [int(r) for r in np.flatnonzero(self.drift > DESYNC_RTOL)]


def _drift(prints: torch.Tensor) -> torch.Tensor:
    """Each rank's fingerprint against rank 0's, relative to the largest: 0 for agreeing
    replicas; inf for one non-finite where others are finite."""
    finite = torch.isfinite(prints)
    scale = prints.abs().where(finite, torch.zeros_like(prints)).max().clamp_min(1e-300)
    relative = (prints - prints[0]).abs() / scale
    mixed = finite.any() & ~finite.all()
    return torch.where(mixed & (finite != finite[0]), torch.full_like(prints, math.inf),
                       torch.where(finite.all(), relative, torch.zeros_like(prints)))


def describe_ranks(ranks: list[int], world: int) -> str:
    """"on rank 1 only", "on ranks 0, 1", "on every rank"."""
    if len(ranks) == world:
        return "on every rank"
    if len(ranks) == 1:
        return f"on rank {ranks[0]} only"
    return f"on ranks {', '.join(map(str, ranks))}"


@dataclass(frozen=True, slots=True)
class DistributedContext:
    """This process's place in an initialised process group of more than one rank."""

    rank: int
    world_size: int
    device: torch.device
    """Where collectives run: the CPU for gloo, the current CUDA device for nccl."""
    backend: str
    link: PeerLink = field(default_factory=lambda: PeerLink(), compare=False, repr=False)
    """trainguard's own collectives (its process group, timeout, and whether a peer was lost)."""

    @property
    def is_main(self) -> bool:
        """Rank 0: the only rank that writes the run store and prints."""
        return self.rank == 0

    def agree_max(self, code: int) -> int:
        """The largest `code` over all ranks, e.g. the most severe action any rank chose.

        A collective (every rank must call it at the same point) with one read on the host: meant
        for decisions taken from rank-local data, not for every step's signals.
        """
        if isinstance(code, bool) or not isinstance(code, int):
            raise UsageError(f"agree_max takes an int code, got {type(code).__name__}")
        value = torch.tensor([code], dtype=torch.int64, device=self.device)
        self.link.call(dist.all_reduce, value, op=dist.ReduceOp.MAX)
        return int(to_host(value)[0])


def distributed_context(model_device: torch.device) -> DistributedContext | None:
    """The context of this rank, or None outside a process group of more than one rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size()
    if world <= 1:
        return None
    backend = str(dist.get_backend())
    return DistributedContext(rank=dist.get_rank(), world_size=world,
                              device=collective_device(backend, model_device), backend=backend)


def collective_device(backend: str, model_device: torch.device) -> torch.device:
    """The device whose tensors `backend` reduces."""
    name = backend.lower()
    if name == "gloo":
        return torch.device("cpu")
    if name == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    if ":" in name:  # "cpu:gloo,cuda:nccl": the model's device if the group serves it
        served = {part.split(":")[0] for part in name.split(",") if ":" in part}
        if model_device.type in served:
            return model_device
        return torch.device("cpu")
    return model_device  # other backends (mpi, ucc, xccl, ...) reduce where the model lives


# -- trainguard's own collectives ------------------------------------------------------------------
ROLL_CALL_S = 10.0
"""After a collective failed, how long a rank waits for the others to answer the roll call (at
most `distributed.collective_timeout_s`): a dead rank never answers, a living one answers as soon as
its own collective fails too."""


class PeerLink:
    """trainguard's own collectives, and the end of the ranks' agreement when one fails.

    Under gloo they run on a process group of trainguard's own, created with
    `GuardConfig.distributed.collective_timeout_s`, so that a rank that hangs stops the others after
    that long rather than after the default group's timeout. A failed collective leaves the ranks
    out of step (some may have finished it, others not), so nothing trainguard does afterwards could
    be agreed: the first failure is final. This rank then answers a roll call through the process
    group's store, names the ranks that did not answer, tells the run (`on_lost`: record why,
    close it) and raises `PeerLost`; every later collective raises the same error at once, so a
    dead peer is one error, never one `monitor_error` per step.
    """

    def __init__(self) -> None:
        self.group: Any = None
        """The process group of trainguard's collectives; None: the default group."""
        self.timeout_s: float | None = None
        """The timeout of `group`; None: the default group's own."""
        self.lost: PeerLost | None = None
        self.on_lost: Callable[[PeerLost], None] | None = None
        self.step: int | None = None
        """The step being checked, for the message."""
        self._rank = 0
        self._world = 1
        self._roll_call: str | None = None

    def open(self, context: DistributedContext, timeout_s: float, start: int | None) -> None:
        """Every rank calls this at the same point (right after `agree_on_start`): creating a
        process group is itself a collective."""
        self._rank, self._world = context.rank, context.world_size
        if start is not None:
            self._roll_call = f"trainguard/start{start}/roll_call"
        if context.device.type != "cpu" or "gloo" not in context.backend.lower():
            return  # NCCL & co.: a second communicator costs accelerator memory; theirs applies
        try:
            self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
            self.timeout_s = timeout_s
        except Exception as exc:  # the default group serves, with its own timeout
            log.warning("trainguard: no process group of its own (%s: %s); its collectives use "
                        "the default group and its timeout", type(exc).__name__, exc)

    def call(self, collective: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`collective(*args, group=..., **kwargs)`; raises `PeerLost` if it fails in
        communication (a RuntimeError, as backends raise), or failed before. Other errors are
        bugs of the caller's, left to the step's monitoring."""
        if self.lost is not None:
            raise self.lost
        if self.group is not None:
            kwargs["group"] = self.group
        try:
            return collective(*args, **kwargs)
        except (RuntimeError, OSError) as exc:  # what backends raise (DistError is one)
            raise self._lose(exc) from exc

    def _lose(self, error: Exception) -> PeerLost:
        grace = min(ROLL_CALL_S, self.timeout_s or ROLL_CALL_S)
        missing = self._answer_roll_call(grace)
        at = f" at step {self.step}" if self.step is not None else ""
        if missing is None:
            who = ("a rank stopped answering (which one cannot be told: the process group's "
                   "store cannot be reached; if it was there, the rank hosting it is gone)")
        elif missing:
            hung = "timed out" in str(error).lower()  # else the connection broke: it died
            who = (f"rank {missing[0]} {'hangs or ' if hung else ''}is gone" if len(missing) == 1
                   else f"ranks {', '.join(map(str, missing))} {'hang or ' if hung else ''}are "
                        f"gone")
            who += f" (no answer within {grace:g} s)"
        else:
            who = ("the ranks fell out of step, though every rank still answers (one spent "
                   "longer than GuardConfig.distributed.collective_timeout_s outside its steps?)")
        lost = PeerLost(
            f"trainguard: {who}: its all-reduce{at} failed on rank {self._rank} "
            f"({type(error).__name__}: {_first_sentence(error)}). The ranks can no longer agree "
            f"on their steps, so training stops here; the run is recorded as failed",
            ranks=missing, step=self.step)
        self.lost = lost
        if self.on_lost is not None:
            try:
                self.on_lost(lost)
            except Exception as exc:  # the error itself still reaches the loop
                log.error("trainguard: could not record the lost peer (%s: %s)",
                          type(exc).__name__, exc)
        return lost

    def _answer_roll_call(self, grace_s: float) -> list[int] | None:
        """The ranks that do not answer within `grace_s`; None when the store cannot be used."""
        if self._roll_call is None:
            return None
        try:
            store = dist.distributed_c10d._get_default_store()
            keys = [f"{self._roll_call}/rank{r}" for r in range(self._world)]
            store.set(keys[self._rank], "here")
            missing = [r for r in range(self._world) if r != self._rank]
            deadline = time.monotonic() + grace_s
            while True:
                missing = [r for r in missing if not store.check([keys[r]])]
                if not missing or time.monotonic() >= deadline:
                    return missing
                time.sleep(0.1)
        except Exception:  # the store's host is gone too
            return None


def _first_sentence(error: Exception) -> str:
    """gloo's errors go on with advice about the remote worker; the first sentence says it."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = re.sub(r"^\[[^\]]*:\d+\]\s*", "", text)  # the source location in gloo
    return text.split(". ")[0][:300]


# -- every rank or none ----------------------------------------------------------------------------
_STARTS = itertools.count()
"""How many guarded runs this process started: the n-th run of every rank agrees with the others'
n-th (ranks run the same code)."""

AGREED_CONFIG_FIELDS_EXCLUDED = frozenset({"sinks.console", "sinks.store", "sinks.trackers",
                                           "checkpoints.snapshot_dir"})
"""Config fields (dotted) a rank may set for itself (they decide nothing every rank must do
alike)."""


def agree_on_start(context: DistributedContext, payload: dict[str, Any],
                   timeout_s: float) -> int | None:
    """Every rank announces that it runs trainguard, and what with, through the process group's
    store (no collective: a rank that never calls this cannot make the others hang in one), then
    waits up to `timeout_s` for the others. Raises `UsageError` naming the rank that did not
    start trainguard in time, or the first field in which a rank's setup differs from rank 0's:
    the ranks' per-step all-reduces would otherwise hang or mix different things. Returns the
    number of this start, which every rank shares (None without a store)."""
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception:  # no store to meet in (a custom process group): nothing to agree through
        return None
    start = next(_STARTS)
    mine = json.dumps(payload, sort_keys=True, default=str)
    keys = [f"trainguard/start{start}/rank{r}" for r in range(context.world_size)]
    store.set(keys[context.rank], mine)
    deadline = time.monotonic() + timeout_s
    missing = list(range(context.world_size))
    while missing:
        missing = [r for r in missing if not store.check([keys[r]])]
        if not missing:
            break
        if time.monotonic() >= deadline:
            shown = ", ".join(map(str, missing))
            raise UsageError(
                f"trainguard: rank(s) {shown} did not start trainguard within {timeout_s:g} s of "
                f"rank {context.rank}: every rank must run it (the Guard, or the callback "
                f"added on every rank, not only on rank 0), since the ranks agree on every step "
                f"through collectives; a rank without it would make the others wait forever")
        time.sleep(0.05)
    reference = json.loads(store.get(keys[0]).decode())
    for rank in range(1, context.world_size):
        theirs = json.loads(store.get(keys[rank]).decode())
        difference = _first_difference(reference, theirs)
        if difference is not None:
            raise UsageError(f"trainguard: rank {rank} runs trainguard with another setup than "
                             f"rank 0: {difference}; every rank must guard the same model with "
                             f"the same configuration")
    return start


def _first_difference(ours: Any, theirs: Any, where: str = "") -> str | None:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(set(ours) | set(theirs)):
            if key not in ours or key not in theirs:
                return f"{where}{key} is set on one rank only"
            found = _first_difference(ours[key], theirs[key], f"{where}{key}.")
            if found is not None:
                return found
        return None
    if ours != theirs:
        return f"{where.rstrip('.')} is {theirs!r} there, {ours!r} on rank 0"
    return None


# -- sharded tensors -----------------------------------------------------------------------------
def shard_count(tensor: torch.Tensor) -> int:
    """In how many parts a DTensor is split across its mesh (1 for a replicated tensor)."""
    placements = getattr(tensor, "placements", None)
    mesh = getattr(tensor, "device_mesh", None)
    if placements is None or mesh is None:
        return 1
    count = 1
    for dim, placement in enumerate(placements):
        if placement.is_shard():
            count *= mesh.size(dim)
    return count


class LocalShardGradientProbe(GradientProbe):
    """The gradient probe on each gradient's local shard (DTensor.to_local()).

    The returned gradients share storage with the sharded ones, so clipping them in place clips
    the DTensors; their norms are the shards' norms until the step's all-reduce combines them.
    """

    def grads(self) -> tuple[list[int], list[torch.Tensor]]:
        index, grads = super().grads()
        return index, [local_tensor(g) for g in grads]


# -- agreement -----------------------------------------------------------------------------------
class RankAgreement:
    """Keeps the Engines of all ranks in agreement on one watched model."""

    def __init__(self, context: DistributedContext, watched: WatchedParams) -> None:
        self.context = context
        self.watched = watched
        world = context.world_size
        counts = [shard_count(p) for p in watched.params]
        # Each rank contributes shards/world of its squared norm: a sharded gradient's shards add
        # up to the whole, a replicated (DDP) gradient counts once, as the mean over ranks.
        self.shares = torch.tensor([c / world for c in counts], dtype=torch.float64,
                                   device=context.device)
        self.replicated = [i for i, c in enumerate(counts) if c == 1]
        """Watched parameters whose copies must be equal on every rank (checked for desync)."""
        self.sharded = any(c > 1 for c in counts)
        """Some watched parameter is sharded across ranks (FSDP): each rank holds a part."""
        self._numel = np.array([max(watched.params[i].numel(), 1) for i in self.replicated],
                               dtype=np.float64)
        self._reported: tuple[str, ...] = ()
        self._last_agreed: int | None = None
        """The last step at which the desync check found the replicas equal."""
        # fixed pseudo-random weights: a drift in any one parameter moves the weighted sum
        count = len(self.replicated)
        self._print_weights = torch.tensor(
            [1.0 + ((i * 0.6180339887498949) % 1.0) for i in range(count)], dtype=torch.float64,
            device=watched.params[self.replicated[0]].device if count else context.device)

    def step_pack(self, model_device: torch.device, *, on_host: bool | None = None,
                  fingerprint: bool = False, ring_wish: int | None = None) -> AgreedPack:
        """The DevicePack of one step: the agreed signals are reduced across ranks at fetch.

        `on_host`: reduce after the transfer, on the host copy; by default only when collectives
        run on the CPU and the model does not (gloo serving an accelerator). `fingerprint`: the
        step's all-reduce carries a weight fingerprint; `ring_wish`: the good-state interval
        this rank's cadence asks for (under `recover`). Both are the step's, not the agreement's.
        """
        if on_host is None:
            on_host = self.context.device.type == "cpu" and model_device.type != "cpu"
        return AgreedPack(model_device, self, on_host=on_host, fingerprint=fingerprint,
                          ring_wish=ring_wish)

    # The all-reduce, on tensors of the collective device (or of the host, on the host path).
    def local_vector(self, loss: torch.Tensor | None, fp16_maxabs: torch.Tensor | None,
                     param_norms: torch.Tensor,
                     fingerprint: torch.Tensor | None = None,
                     ring_wish: int | None = None) -> torch.Tensor:
        """This rank's values, float64 on the collective device; no host sync."""
        device = self.context.device
        world, rank = self.context.world_size, self.context.rank
        norms = param_norms.reshape(-1).to(device=device, dtype=torch.float64)
        head = torch.zeros(_HEAD, dtype=torch.float64, device=device)
        slots = torch.zeros(_RANK_BLOCKS, world, dtype=torch.float64, device=device)
        if loss is not None:
            value = loss.reshape(()).to(device=device, dtype=torch.float64)
            head[_LOSS] = value
            head[_LOSS_RANKS] = 1.0
            head[_LOSS_NONFINITE] = (~torch.isfinite(value)).to(torch.float64)
            slots[_RANK_LOSS, rank] = value
            slots[_RANK_LOSS_BAD, rank] = head[_LOSS_NONFINITE]
        slots[_RANK_GRAD_BAD, rank] = (~torch.isfinite(norms).all()).to(torch.float64)
        if fingerprint is not None:
            slots[_RANK_PRINT, rank] = fingerprint.reshape(()).to(device=device,
                                                                 dtype=torch.float64)
        if ring_wish is not None:
            slots[_RANK_WISH, rank] = float(ring_wish)
        if fp16_maxabs is not None:
            head[_FP16] = fp16_maxabs.reshape(()).to(device=device, dtype=torch.float64)
            head[_FP16_RANKS] = 1.0
        return torch.cat([head, slots.reshape(-1), norms])

    def weight_fingerprint(self) -> torch.Tensor | None:
        """One float64 on the weights' device summing up this rank's replicated weights: a
        weighted sum of their norms (one fused pass over the weights, no host sync). Ranks whose
        replicas agree give the same value."""
        if not self.replicated:
            return None
        params = [local_tensor(self.watched.params[i]).detach() for i in self.replicated]
        norms = torch._foreach_norm(params, 2, dtype=torch.float64)
        stacked = torch.stack([n.to(params[0].device) for n in norms])
        return (stacked * self._print_weights).sum()

    def reduce(self, local: torch.Tensor) -> torch.Tensor:
        """One SUM all-reduce; returns [loss, loss_ranks, fp16_maxabs, fp16_ranks, grad_norm,
        per-parameter norms...], identical on every rank.

        SUM keeps NaN (NaN + x is NaN) and +inf; +inf on one rank and -inf on another give NaN,
        still non-finite. Values are divided by the world size before the sum, so finite losses
        near the float limit cannot overflow to inf. float64: squared norms up to 1e154 are safe.
        The float16 gradient maximum is the mean of the ranks' maxima: exact for replicated (DDP)
        gradients, whose maxima are equal; a sum cannot recover the maximum over shards.
        """
        world = float(self.context.world_size)
        norms_at = _HEAD + _RANK_BLOCKS * self.context.world_size
        contribution = local.clone()
        contribution[_LOSS] = local[_LOSS] / world
        contribution[_FP16] = local[_FP16] / world
        contribution[norms_at:] = local[norms_at:].square() * self.shares
        self.context.link.call(dist.all_reduce, contribution, op=dist.ReduceOp.SUM)
        loss = contribution[_LOSS] * world / contribution[_LOSS_RANKS]  # 0/0 if no rank had one
        # A rank's non-finite loss stays non-finite whatever the others add (belt and braces).
        loss = torch.where((contribution[_LOSS_NONFINITE] > 0) & torch.isfinite(loss),
                           torch.full_like(loss, math.nan), loss)
        fp16 = contribution[_FP16] * world / contribution[_FP16_RANKS]
        squares = contribution[norms_at:]
        head = torch.stack([loss, contribution[_LOSS_RANKS], fp16, contribution[_FP16_RANKS],
                            squares.sum().sqrt()])
        slots = contribution[_HEAD:norms_at].reshape(_RANK_BLOCKS, -1).clone()
        slots[_RANK_PRINT] = _drift(slots[_RANK_PRINT])  # float64 here; the host gets float32
        return torch.cat([head, slots.reshape(-1), squares.sqrt()])

    def reduce_sampled(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Agree on the sampled statistics that detectors act on, so a weight that went
        non-finite or extreme on one rank's shard is seen by every rank: each key as its registry
        entry says, maxima (|w|, non-finite flags) by MAX, norms (weights, optimizer moments) as
        sums of squares like the gradient norms. Two small all-reduces, only on steps that carry
        sampled statistics. Means and spreads stay this rank's own (of its shard under FSDP2)."""
        device = self.context.device
        out: dict[str, torch.Tensor] = {}
        for op in _SAMPLED_REDUCTIONS:  # a fixed order: every rank runs the same collectives
            names = [n for n in local if _sampled_reduction(n) is op]
            if not names:
                continue
            parts = [local[n].to(device=device, dtype=torch.float64) for n in names]
            flat = torch.cat(parts)
            if op is Reduction.MAX:
                self.context.link.call(dist.all_reduce, flat, op=dist.ReduceOp.MAX)
            else:
                shares = torch.cat([self.shares] * len(names))
                flat = flat.square() * shares
                self.context.link.call(dist.all_reduce, flat, op=dist.ReduceOp.SUM)
                flat = flat.sqrt()
            offset = 0
            for name, part in zip(names, parts, strict=True):
                out[name] = flat[offset:offset + part.numel()]
                offset += part.numel()
        return out

    def split(self, agreed: np.ndarray) -> dict[str, np.ndarray]:
        """The host view of `reduce`'s result, by DevicePack segment name."""
        world = self.context.world_size
        slots_end = 5 + _RANK_BLOCKS * world
        out = {"grad_norm": agreed[4:5], "param_grad_norm": agreed[slots_end:],
               "ranks": agreed[5:slots_end]}
        if agreed[1] > 0:
            out["loss"] = agreed[0:1]
        if agreed[3] > 0:
            out["fp16_grad_maxabs"] = agreed[2:3]
        return out

    def gather_batches(self, mine: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank's facts about its own batch of this step, by rank (whether it was
        inspected, whether it held NaN/inf, its batch events as dicts). A collective: the caller
        runs it only on steps whose agreed signals raised trouble, the same steps on every rank.
        Objects, not a tensor: the events' texts differ in length."""
        gathered: list[Any] = [None] * self.context.world_size
        self.context.link.call(dist.all_gather_object, gathered, mine)
        return gathered

    # -- desync check (guide §3.4.1) -------------------------------------------------------------
    def fingerprints(self) -> torch.Tensor:
        """[norm; sum] of each replicated parameter, float64 on the collective device."""
        device = self.context.device
        params = [local_tensor(self.watched.params[i]).detach() for i in self.replicated]
        norms = torch._foreach_norm(params, 2, dtype=torch.float64)
        sums = [p.sum(dtype=torch.float64) for p in params]
        return torch.stack([torch.stack([n.to(device) for n in norms]),
                            torch.stack([s.to(device) for s in sums])])

    @torch.no_grad()
    def replicas_agree(self, step: int, view: RankView) -> bool:
        """The cheap check, from the fingerprints that rode the step's all-reduce: True when
        every rank's replicas agree with rank 0's (or nothing was fingerprinted this step).
        When they do not, every rank runs `check_desync` at this step to name the parameters."""
        if view.drift is None or not self.replicated:
            return True
        if view.drifted():
            return False
        self._last_agreed = step
        self._reported = ()
        return True

    def rank_view(self, slots: np.ndarray, fingerprinted: bool,
                  wished: bool = False) -> RankView:
        blocks = slots.reshape(_RANK_BLOCKS, self.context.world_size)
        return RankView(loss=blocks[_RANK_LOSS], loss_nonfinite=blocks[_RANK_LOSS_BAD] > 0,
                        grad_nonfinite=blocks[_RANK_GRAD_BAD] > 0,
                        drift=blocks[_RANK_PRINT] if fingerprinted else None,
                        ring_wish=blocks[_RANK_WISH] if wished else None)

    def check_desync(self, step: int) -> list[Event]:
        """Gather every rank's fingerprints (one all-gather, one host read) and compare them.

        A collective: every rank calls it at the same step. Reports a drifted set of parameters
        once, and again only when the set changes; the event carries the last step at which the
        replicas were found equal (`last_agreed_step`, 0 before any such check).
        """
        if not self.replicated:
            return []
        world = self.context.world_size
        mine = self.fingerprints()
        gathered = [torch.empty_like(mine) for _ in range(world)]
        self.context.link.call(dist.all_gather, gathered, mine)
        table = to_host(torch.stack(gathered).reshape(-1)).reshape(world, 2, -1)
        relative = replica_difference(table, self._numel)
        drifted = np.flatnonzero(relative > DESYNC_RTOL)
        names = tuple(self.watched.names[self.replicated[i]] for i in drifted)
        if not names:  # a rollback returns to a state from no later than this step
            self._last_agreed = step
        if names == self._reported:
            return []
        self._reported = names
        if not names:
            return []
        worst = int(drifted[np.argmax(relative[drifted])])
        ranks = [r for r in range(1, world)
                 if replica_difference(table[[0, r]], self._numel)[worst] > DESYNC_RTOL]
        largest = float(relative[worst])
        worst_name = self.watched.names[self.replicated[worst]]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        last_agreed = 0 if self._last_agreed is None else self._last_agreed
        message = (f"replicas out of sync across ranks: {len(names)} parameter(s) differ, most "
                   f"{worst_name} (relative difference {largest:.3g}; rank(s) "
                   f"{', '.join(map(str, ranks))} differ from rank 0): {shown}")
        return [Event(kind="ddp_desync", step=step, severity="error", message=message,
                      param=worst_name, value=largest,
                      details={"cause": "ddp_desync", "params": list(names),
                               "max_rel_diff": largest, "ranks": ranks,
                               "last_agreed_step": last_agreed})]


def replica_difference(table: np.ndarray, numel: np.ndarray) -> np.ndarray:
    """Per parameter, how far the ranks' fingerprints part, relative to the parameter's norm.

    `table` is [ranks, 2 (norm, sum), params]. A sum differs by at most sqrt(numel) times the
    norm, hence its scaling. A fingerprint finite on some ranks and not on others is infinitely
    far; one non-finite on every rank cannot be compared (non-finite weights are reported by
    their own detector) and counts as equal.
    """
    finite = np.isfinite(table)
    all_finite = finite.all(axis=0)
    mixed = (finite.any(axis=0) & ~all_finite).any(axis=0)
    clean = np.where(all_finite, table, 0.0)
    spread = clean.max(axis=0) - clean.min(axis=0)
    scale = np.maximum(np.abs(clean[:, 0, :]).max(axis=0), np.finfo(np.float64).tiny)
    relative = np.maximum(spread[0], spread[1] / np.sqrt(numel)) / scale
    return np.where(mixed, np.inf, relative)


class AgreedPack(DevicePack):
    """A DevicePack whose agreed segments are reduced across ranks when fetched: the every-step
    signals with a cross-rank reduction in the registry (loss, gradient norms, the float16
    gradient maximum) and, on sampled steps, the per-parameter statistics the registry agrees.

    Other segments travel as they are. With collectives on the model's device the all-reduce runs
    before the one transfer; with collectives on the CPU (gloo) and the model elsewhere it runs
    after it, on the host copy, so that no second device-to-host transfer is needed.
    """

    def __init__(self, device: torch.device | None, agreement: RankAgreement, *,
                 on_host: bool, fingerprint: bool = False, ring_wish: int | None = None) -> None:
        super().__init__(device)
        self._agreement = agreement
        self._on_host = on_host
        self._local: dict[str, torch.Tensor] = {}
        self._sampled: dict[str, torch.Tensor] = {}
        self._fingerprint = agreement.weight_fingerprint() if fingerprint else None
        self.fingerprinted = self._fingerprint is not None
        self.ring_wish = ring_wish
        self._agreed: torch.Tensor | None = None
        """The step's reduced vector, once `agree_now` ran it."""

    @property
    def reduces_on_host(self) -> bool:
        """Whether the all-reduce waits for the transfer (gloo serving an accelerator)."""
        return self._on_host

    def agree_now(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Under `sync="deferred"`: the step's all-reduce now, before the optimizer step, on the
        collective device (no host read). Returns the agreed global gradient norm and loss (None
        without one) as float32 scalars on the model's device, as the host will read them."""
        if self._on_host:
            raise UsageError("the agreed signals of this pack are reduced on the host")
        local, agreement = self._local, self._agreement
        self._agreed = agreement.reduce(agreement.local_vector(
            local.get("loss"), local.get("fp16_grad_maxabs"), local["param_grad_norm"],
            self._fingerprint, self.ring_wish))
        device = self.device if self.device is not None else self._agreed.device
        norm = self._agreed[4].to(device=device, dtype=torch.float32)
        loss = (self._agreed[0].to(device=device, dtype=torch.float32) if "loss" in local
                else None)
        return norm, loss

    def start_fetch(self, finish: Finish | None = None) -> PendingPack:
        """The step's transfer started without a wait (after `agree_now`'s all-reduce, or one
        now); split as `fetch` splits it."""
        if self._on_host:
            raise UsageError("the agreed signals of this pack are reduced on the host")
        self._reduce_sampled()
        if self._agreed is None:
            self.agree_now()
        assert self._agreed is not None
        super().add("agreed", self._agreed)
        agreement = self._agreement

        def split(host: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            host.update(agreement.split(host.pop("agreed")))
            return host if finish is None else finish(host)

        return super().start_fetch(split)

    def _reduce_sampled(self) -> None:
        if self._sampled:  # heavy-probe results of a sampled step: decisions read them too
            for name, tensor in self._agreement.reduce_sampled(self._sampled).items():
                super().add(name, tensor)
            self._sampled = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if _agreed_every_step(name):
            self._local[name] = tensor.detach().reshape(-1)
        elif _sampled_reduction(name) is not None and not self._on_host:
            self._sampled[name] = tensor.detach().reshape(-1)
        else:
            super().add(name, tensor)

    def fetch(self) -> dict[str, np.ndarray]:
        agreement, local = self._agreement, self._local
        self._reduce_sampled()
        if self._on_host:
            for name, tensor in local.items():
                super().add(f"local:{name}", tensor)
            if self._fingerprint is not None:  # rides the one transfer, as two float32 halves
                high = self._fingerprint.to(torch.float32)
                super().add("local:print_hi", high)
                super().add("local:print_lo", (self._fingerprint - high.double()).float())
            host = super().fetch()
            raw = {name: torch.from_numpy(host.pop(f"local:{name}")) for name in local}
            printed = None
            if "local:print_hi" in host:
                printed = torch.from_numpy(host.pop("local:print_hi") + host.pop("local:print_lo"))
            agreed_t = agreement.reduce(agreement.local_vector(
                raw.get("loss"), raw.get("fp16_grad_maxabs"), raw["param_grad_norm"], printed,
                self.ring_wish))
            agreed = agreed_t.cpu().numpy()  # already there: collectives on the CPU
        else:
            vector = agreement.reduce(agreement.local_vector(
                local.get("loss"), local.get("fp16_grad_maxabs"), local["param_grad_norm"],
                self._fingerprint, self.ring_wish))
            super().add("agreed", vector)
            host = super().fetch()
            agreed = host.pop("agreed")
        host.update(agreement.split(agreed))
        return host


def describe(context: DistributedContext | None) -> dict[str, Any]:
    """Rank, world size and backend for the run store (empty for a single process)."""
    if context is None:
        return {}
    return {"rank": context.rank, "world_size": context.world_size, "backend": context.backend}


_SAMPLED_REDUCTIONS = (Reduction.MAX, Reduction.SUM_OF_SQUARES)


def _agreed_every_step(name: str) -> bool:
    """Whether a step segment is one of the every-step signals the step's all-reduce agrees."""
    metric = metric_key(name)
    return metric is not None and not metric.sampled and metric.reduction is not Reduction.LOCAL


def _sampled_reduction(name: str) -> Reduction | None:
    """How a pending sampled segment ("p<i>:<key>") is agreed across ranks, if at all."""
    prefix, _, key = name.partition(":")
    if not key or not prefix.startswith("p"):
        return None
    metric = metric_key(key)
    if metric is None or metric.scope is not Scope.PARAM \
            or metric.reduction not in _SAMPLED_REDUCTIONS:
        return None
    return metric.reduction
