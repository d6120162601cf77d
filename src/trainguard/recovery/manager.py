"""`Recovery`: the `recover` policy's moving parts (good-state ring, judgement, LR backoff, data
skip list) behind a few calls the step pipeline makes: `before_measure` (measure), `review`
(decide), `rollback` (act), `after_schedule` and `after_applied` (settle). It holds no reference
to the run's state: a rollback returns a `Rollback` saying what changes there (the detectors'
baselines to put back, the clipping limit to tighten to), and `act` applies it to `RunState`, their
one home.

A rollback restores what this run owns: the model, the optimizer, the scheduler (with
`rewind_schedule`), the scaler and the Guard's own baselines. The process-wide random number
generators are shared with everything else in the process (another model and its Guard, the data
pipeline) and are put back only with `RecoveryConfig.restore_rng`."""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from trainguard.config import GuardConfig
from trainguard.distributed import DistributedContext
from trainguard.events import Event
from trainguard.probes.sample_cadence import SampleCadence
from trainguard.recovery.cadence import RingCadence, RingFeeder
from trainguard.recovery.controller import RecoveryController, Verdict, troubling
from trainguard.recovery.data import flatten_ids
from trainguard.recovery.lr import LRBackoff, set_lr
from trainguard.recovery.ring import GoodStateRing
from trainguard.recovery.state import SavedState, capture, restore
from trainguard.registry import is_rank_local
from trainguard.signals import StepSignals
from trainguard.transfer import to_host

log = logging.getLogger("trainguard")

RING_FLAG = "ring_finite"
"""Name of the candidate's finite flag in the step's packed transfer."""


@dataclass(frozen=True)
class Rollback:
    """What a rollback changes beyond the model, optimizer, scheduler and scaler it restored
    itself: the run's state that `act` puts back and tightens, and what the event says."""
    step: int
    to_step: int
    guard_state: dict[str, Any]
    """The run state the good state kept (`RunState.rewind_state`), to put back."""
    max_grad_norm: float | None
    """The fixed clipping limit to tighten to (`ClipChain.tighten`); None: clipping stays
    as it was (a rollback after the loop raised the LR: a tighter clip would be a lasting cut of
    the updates after the cause has gone, 3.16 -> 3.40 on a small GPT-2 clipped at 0.5 all run)."""
    lr_factor: float
    lr_ceiling: float | None
    lr_ceilings: tuple[float | None, ...]
    lr_in_trouble: float | None
    lr_floor: float | None
    """The first group's floor: the ramp never cuts its schedule below this LR (None: none)."""
    lr_ramp_steps: int
    skipped_data: tuple[Any, ...]
    """Data ids this rollback blamed (skipped from now on)."""
    rollbacks: int
    reason: str

    @property
    def steps_undone(self) -> int:
        return self.step + 1 - self.to_step

    def event(self, clip: float | None, *, adaptive: bool) -> Event:
        """The `rollback` event, once the run state is applied: `clip` the limit then in force,
        `adaptive` when no fixed limit was set (the adaptive clip's)."""
        limit = f", never above LR {self.lr_ceiling:.3g}" if self.lr_ceiling is not None else ""
        if self.lr_factor < 1.0:
            lr = f"LR x{self.lr_factor:g} ramping back over {self.lr_ramp_steps} steps"
            if self.lr_floor is not None:
                lr += f" (the schedule's LR never cut below {self.lr_floor:.3g})"
        elif self.lr_floor is not None:  # the schedule is already far below the LR that failed
            lr = f"LR not cut (the schedule's is at most {self.lr_floor:.3g})"
        else:
            lr = "LR kept"
        clipping = ("no clipping" if clip is None else
                    f"clipping a step whose norm is abnormal for this run (above {clip:.3g})"
                    if adaptive else f"clipping at {clip:g}")
        blamed = self.skipped_data
        return Event(
            kind="rollback", step=self.step, severity="warning",
            message=f"{self.reason}: rolled back to the good state from step {self.to_step} "
                    f"({self.steps_undone} steps undone), {lr}{limit}, {clipping}"
                    + (f", {len(blamed)} data id(s) skipped from now on" if blamed else ""),
            value=float(self.to_step),
            details={"to_step": self.to_step, "steps_undone": self.steps_undone,
                     "lr_factor": self.lr_factor, "lr_ceiling": self.lr_ceiling,
                     "lr_ceilings": list(self.lr_ceilings),
                     "lr_in_trouble": self.lr_in_trouble, "lr_floor": self.lr_floor,
                     "max_grad_norm": clip, "skipped_data": list(blamed[:50]),
                     "rollbacks": self.rollbacks, "reason": self.reason})


class Recovery:
    def __init__(self, *, dist: DistributedContext | None, model: nn.Module,
                 optimizers: list[torch.optim.Optimizer], scheduler: Any, scaler: Any,
                 config: GuardConfig, sampling: SampleCadence | None = None) -> None:
        self.dist = dist
        self.model = model
        self.optimizers = optimizers
        self.scheduler = scheduler
        """Restored with the rest; whoever steps it (the Guard, a trainer) calls `after_schedule`
        after each applied update so the LR backoff moves on."""
        self.scaler = scaler
        self.config = config.recovery
        self.ring = GoodStateRing(self.config.ring_size, self.config.confirm_steps)
        self.cadence = RingCadence(self.config.ring_every, self.config.ring_budget)
        self.feeder = RingFeeder(self.ring, self.cadence)
        self.controller = RecoveryController(self.config, config.detectors,
                                             config.probes.sample_every, sampling)
        self.lr = LRBackoff(optimizers, [scheduler] if scheduler is not None else [],
                            self.config.lr_ramp_steps)
        self.skipped_data: set[Any] = set()
        """Data ids the rollbacks blamed; `SkippingSampler` and resumable pipelines skip them."""
        self.rolled_back_steps = 0
        """Updates thrown away by rollbacks (the extra compute recovery cost)."""
        self._recent_ids: deque[tuple[int, Any]] = deque(
            maxlen=self.config.settle_steps + self.config.rollback_after_skips + 2)
        self._recent_lrs: deque[tuple[int, tuple[float, ...]]] = deque(
            maxlen=self.config.ring_size * self.config.ring_every + self.config.settle_steps
            + self.config.rollback_after_skips + 2)
        """The LR of every group at each recent step (as used by its update): a rollback's
        ceiling is set below the highest LR among the updates it undoes."""
        self._last_rollback: int | None = None
        self._capture_from_restart = False
        """An older checkpoint without `last_capture`: the cadence counts from the loaded step."""

    # -- around each step ------------------------------------------------------------------------
    def start(self, step: int, guard_state: dict[str, Any]) -> None:
        """Keep the state training starts from (at `step`, with the run state `guard_state` a
        rollback puts back) as the first good state (checked directly)."""
        # not timed: it allocates the buffers later captures reuse
        state = self._capture(step, guard_state)
        finite = state.finite is None or bool(to_host(state.finite.reshape(1))[0] == 1.0)
        if not self.ring.promote_now(state, finite=finite):
            log.error("trainguard: the initial weights or optimizer state are not finite; "
                      "there is no good state to roll back to yet")

    def before_measure(self) -> list[str]:
        """At the start of a step's measurement, before its LR is read: put the LR backoff back
        on a learning rate the loop wrote itself since the last step; returns what the loop did
        to a cut LR (`LRBackoff.enforce`)."""
        return self.lr.enforce()

    def extra(self) -> dict[str, torch.Tensor]:
        flag = self.ring.pending_flag()
        return {RING_FLAG: flag} if flag is not None else {}

    def review(self, signals: StepSignals, extra: dict[str, np.ndarray], events: list[Event],
               applies_update: bool, data_ids: Any, *,
               nonfinite_input: bool = False) -> Verdict | None:
        """`extra`: the host copies of the step's extra tensors (the ring's finite flag);
        `nonfinite_input`: this rank's batch holds NaN/inf."""
        self._recent_ids.append((signals.step, data_ids))  # flattened only when blamed
        if signals.ranks is not None and getattr(signals.ranks, "ring_wish", None) is not None:
            self.cadence.agree(list(signals.ranks.ring_wish))
        lrs = self._group_lrs(signals)
        self.lr.observe(lrs)  # a tensor LR is kept under its ceiling with the transferred value
        self._recent_lrs.append((signals.step, lrs))
        # Batch findings are rank-local under torch.distributed; everything else here comes from
        # signals all ranks agreed on, so every rank keeps the same ring and makes the same call.
        shared = [e for e in events if not is_rank_local(e.kind)]
        calm = applies_update and not troubling(shared)
        bad_input = False
        if not (signals.loss_finite and signals.grads_finite):
            # NaN in the batch itself: the data, not the state, is broken (agreed across ranks,
            # since batches are rank-local)
            bad_input = nonfinite_input
            if self.dist is not None:
                bad_input = self.dist.agree_max(int(bad_input)) == 1
        verdict = self.controller.review(signals, shared, applies_update, bad_input=bad_input)
        if verdict is not None:
            calm = False
            if verdict.action == "skip":  # a batch whose update is kept out is a suspect too
                self.skipped_data.update(self._ids_of(verdict.bad_steps))
        flag = extra.get(RING_FLAG)
        if flag is not None and self.dist is not None:
            # each rank checked its own shard (FSDP) or replica: good only if good everywhere
            bad = self.dist.agree_max(0 if bool((flag == 1.0).all()) else 1)
            flag = np.array([0.0 if bad else 1.0])
        self.ring.observe(flag=flag, calm=calm)
        return verdict

    def after_schedule(self) -> None:
        """After the scheduler step of an applied update: the LR backoff ramps on by a step."""
        self.lr.step()

    def after_applied(self, step: int, guard_state: Callable[[], dict[str, Any]]) -> None:
        """After an applied update: offer the new state to the ring at its interval (the
        cadence's, from the measured cost of a capture against the step time). `guard_state`
        is called only when a capture is made (it copies the detectors' baselines)."""
        self.feeder.after_applied(
            step, lambda reuse: self._capture(step, guard_state(), reuse=reuse), "a good state")

    # -- rollback ----------------------------------------------------------------------------------
    def can_roll_back(self) -> bool:
        return len(self.ring) > 0

    def rollback(self, verdict: Verdict, step: int, *, mid_step: bool = True,
                 keep_lr: bool = False) -> Rollback:
        """Restore the newest good state from before the trouble, back the LR off under a lower
        ceiling and blame the suspect batches. Returns the `Rollback`: the run state to put back,
        the clipping to tighten, and what the event says (applied by `act`). `keep_lr`: a replay
        proved the batch at fault, not the LR: the data are skipped and the LR is kept."""
        target = self.ring.latest_before(verdict.onset)
        assert target is not None  # callers check can_roll_back()
        # The update that did the damage is among those this rollback undoes: the LR that failed
        # is the highest they used (the start of a fault is an estimate; a spike in the LR can
        # come a few updates before the trouble shows). Step numbers go on across rollbacks:
        # updates from before the last one were undone by it, and its ceiling accounts for them.
        first = min(target.step, verdict.onset)
        if self._last_rollback is not None:
            first = max(first, self._last_rollback + 1)
        trouble_lrs = self._lrs_since(first)
        relapse = (self._last_rollback is not None
                   and step - self._last_rollback <= self.config.lr_ramp_steps)
        ceilings = self._next_ceilings(trouble_lrs, relapse=relapse)
        if self.scaler is not None and mid_step:
            self.scaler.update()  # closes the scaler's step (the driver called unscale_)
        rewind = self.config.rewind_schedule
        current_lrs = [g["lr"] for opt in self.optimizers for g in opt.param_groups]
        applied = list(target.extra["lr_applied"]) if rewind else list(self.lr.applied)
        restore(target, model=self.model, optimizers=self.optimizers,
                scheduler=self.scheduler if rewind else None, scaler=self.scaler,
                rng=self.config.restore_rng)
        if not rewind:  # the schedule goes on from where it is, as the data does
            groups = [g for opt in self.optimizers for g in opt.param_groups]  # new after restore
            for group, lr in zip(groups, current_lrs, strict=True):
                set_lr(group, lr)
        if keep_lr:
            self.lr.begin(1.0, [None] * len(ceilings), applied)
        else:
            self.lr.begin(self.config.lr_backoff, ceilings, applied,
                          floors=self._floors(ceilings, relapse=relapse))
        self.ring.discard_after(target.step)
        self.feeder.last_capture = target.step
        blamed = self._ids_of(verdict.bad_steps)
        self.skipped_data.update(blamed)
        self.controller.rolled_back()
        self._last_rollback = step
        self.rolled_back_steps += step + 1 - target.step
        return Rollback(
            step=step, to_step=target.step, guard_state=target.guard,
            max_grad_norm=None if verdict.after_lr_raise else self.config.max_grad_norm,
            lr_factor=self.lr.factor(),
            lr_ceiling=self.lr.ceiling(), lr_ceilings=tuple(self.lr.ceilings),
            lr_in_trouble=trouble_lrs[0] if trouble_lrs else None,
            lr_floor=self.lr.floors[0] if self.lr.active and self.lr.floors else None,
            lr_ramp_steps=self.config.lr_ramp_steps, skipped_data=tuple(blamed),
            rollbacks=self.controller.rollbacks, reason=verdict.reason)

    def _next_ceilings(self, trouble_lrs: Sequence[float], *,
                       relapse: bool) -> list[float | None]:
        """Each group's LR ceiling after this rollback: a share of the lower of its ceiling so far
        and the LR that failed, so that every rollback lowers it. A rollback while the ramp of
        the last one is still on (a relapse) takes `lr_backoff` of it: a fault that comes back is
        a learning rate that is too high, not a bad batch."""
        cfg = self.config
        share = cfg.lr_backoff if relapse else cfg.lr_ceiling
        ceilings: list[float | None] = []
        for i, before in enumerate(self.lr.ceilings_now()):
            lr = trouble_lrs[i] if i < len(trouble_lrs) else math.nan  # a group added since
            base = lr if math.isfinite(lr) and lr > 0 else None  # no LR, no LR to blame
            if before is not None:
                base = before if base is None else min(base, before)
            ceilings.append(None if base is None else base * share)
        return ceilings

    def _floors(self, ceilings: Sequence[float | None], *,
                relapse: bool) -> list[float | None]:
        """Each group's LR floor after this rollback: the LR the ramp starts from while the
        schedule is still at the LR that failed (`lr_backoff` x the ceiling). A schedule already
        under it needs no cut, and gets none while it stays there: the LR that failed has gone
        (the loop put back the LR it had raised). A relapse has none: the trouble came back
        below the LR that failed, and the whole backoff applies."""
        return [None if relapse or c is None else self.config.lr_backoff * c for c in ceilings]

    def _group_lrs(self, signals: StepSignals) -> tuple[float, ...]:
        """The LR of every group for this step's update, as measured (a tensor LR came with the
        step's transfer); read from the groups when the signals do not carry them."""
        lrs = self._host_lrs()
        measured = tuple(getattr(signals, "group_lrs", ()))
        if len(measured) == len(lrs):
            return tuple(float(v) for v in measured)
        if lrs and signals.lr is not None:
            lrs[0] = float(signals.lr)  # the first group's came with the transfer
        return tuple(lrs)

    def _lrs_since(self, first: int) -> tuple[float, ...]:
        """Each group's highest LR in force from step `first` on (the current LRs when no step
        since was measured, as for a rollback by hand right after one)."""
        since = [lrs for recorded, lrs in self._recent_lrs if recorded >= first]
        if not since:
            since = [tuple(self._host_lrs())]
        width = max(len(lrs) for lrs in since)
        return tuple(max((lrs[i] for lrs in since if i < len(lrs) and math.isfinite(lrs[i])),
                         default=math.nan) for i in range(width))

    def _host_lrs(self) -> list[float]:
        """The groups' float LRs as they are now (NaN for a tensor LR: reading it is a sync)."""
        return [math.nan if isinstance(g.get("lr"), torch.Tensor) or g.get("lr") is None
                else float(g["lr"]) for opt in self.optimizers for g in opt.param_groups]

    def _ids_of(self, steps: list[int]) -> list[Any]:
        return [i for s, ids in self._recent_ids if s in steps for i in flatten_ids(ids)]

    # -- state -------------------------------------------------------------------------------------
    def _capture(self, step: int, guard_state: dict[str, Any],
                 reuse: SavedState | None = None) -> SavedState:
        return capture(step=step, model=self.model, optimizers=self.optimizers,
                       scheduler=self.scheduler, scaler=self.scaler, guard_state=guard_state,
                       extra={"lr_applied": list(self.lr.applied)},
                       rng=self.config.restore_rng, reuse=reuse)

    def state_dict(self) -> dict[str, Any]:
        """Judgement, backoff and skip list (the saved states themselves stay in memory; the
        clipping limit a rollback tightened is in `RunState`)."""
        return {"controller": self.controller.state_dict(), "lr": self.lr.state_dict(),
                "skipped_data": sorted(self.skipped_data, key=repr),
                "rolled_back_steps": self.rolled_back_steps,
                "last_rollback": self._last_rollback, "last_capture": self.feeder.last_capture}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Entries an older checkpoint lacks keep their fresh values."""
        if "controller" in state:
            self.controller.load_state_dict(state["controller"])
        if "lr" in state:
            self.lr.load_state_dict(state["lr"])
        self.skipped_data = set(state.get("skipped_data", ()))
        self.rolled_back_steps = int(state.get("rolled_back_steps", 0))
        last = state.get("last_rollback")
        self._last_rollback = None if last is None else int(last)
        # the ring's cadence goes on from the last capture, as it would have without the restart
        # (an older checkpoint without it counts from the loaded step: `restart`)
        last_capture = state.get("last_capture")
        self._capture_from_restart = last_capture is None
        if last_capture is not None:
            self.feeder.last_capture = int(last_capture)

    def restart(self, step: int, guard_state: dict[str, Any]) -> None:
        """After a resume at `step`: the ring starts again from the state loaded, so that its
        first good state carries the loaded step and baselines (not those of the fresh run it
        was built in)."""
        if self._capture_from_restart:
            self.feeder.last_capture = step
            self._capture_from_restart = False
        self.ring.discard_after(-1)
        self.start(step, guard_state)

