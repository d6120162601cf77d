"""When a guarded run proves the causes of an incident (`diagnose.counterfactual`), and with what.

`IncidentProver.see` keeps, from every step, what a proof compares with: the run's recent healthy
losses and gradient norms (two floats already on the host), the time a step takes, and a
reference to the last good batch. `wanted` says whether this step's incident is to be proved:

    policy halt     the step that halts (before its crash snapshot is written); a step bad
                    before its update that its own replays do not explain is replayed again
                    from the state the proof anchor copied before the loop's last LR jump
                    (`diagnose/anchor.py`)
    policy recover  the first rollback (before the good state is restored); a step already bad
                    before its update is replayed again from the good state the rollback
                    returns to, with the same batch and LR; when neither replay confirms
                    anything, the whole window from that state to the step, with each step's
                    batch and LR (kept by `see` since the ring's oldest good state), plainly and
                    with the LR lowered on every step, if the budget allows
    prove="on"      also any step with an error-level event, or a loss or gradient jump of any
                    severity (the first bad step of a fault, before a divergence judged over
                    many steps), under protect or observe, until one proof of an error
                    reproduced its fault (a jump only until any proof did; at most
                    `MAX_ATTEMPTS` tries per run); a step bad before its update that its own
                    replays do not explain is replayed again from the proof anchor's good
                    state (`diagnose/anchor.py`), and as a window from there, as under `recover`;
                    also the first warning before any bad step (`instability_precursor`, a
                    blown-up start: `bad_start`), before anything else was proved: the steps
                    from the oldest good state (the anchor's or the recover ring's) whose
                    window fits the budget up to the warning, judged on the warned signal
                    (`diagnose/warned_signal.py`), the first fix that keeps it under the
                    warning's bound confirmed

`prove` replays the step from the model and optimizer as they are before its update, within
`prove.budget_steps` times a training step, records a `proof` event (which the cause ranking
reads) and puts the step's likely causes right. A failure is logged and the run goes on. A
rollback after a proof that confirmed a bad batch (and not the LR) keeps the LR (`data_fault`):
skipping the data is the fix. After a confirmed float16 overflow, `decide` halts a later rollback
instead with the advice to switch to bf16 (`precision_fault`): no rollback changes the precision.
Under torch.distributed nothing is proved (a replay's backward would all-reduce on one rank alone).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import torch

from trainguard.diagnose.counterfactual import (
    DATA_CAUSES,
    WINDOW_LAST,
    Baseline,
    Outcome,
    Proof,
    ReplayState,
    Setup,
    WindowStep,
    left_level,
    prove,
    record_stands,
    recorded_window,
    replays_record,
)
from trainguard.diagnose.ranking import likely_causes, rank_causes
from trainguard.diagnose.warned_signal import LOSS, WarnedSignal
from trainguard.errors import UsageError
from trainguard.events import Event, at_least
from trainguard.recovery.state import restore
from trainguard.registry import Tag, is_trouble, kinds_tagged
from trainguard.rng import put_torch_state

if TYPE_CHECKING:
    from torch import nn

    from trainguard.config import GuardConfig
    from trainguard.diagnose import Finding
    from trainguard.diagnose.anchor import ProofAnchor
    from trainguard.diagnose.replay import LossFn
    from trainguard.diagnose.step_rng import StepRNG
    from trainguard.distributed import DistributedContext
    from trainguard.pipeline.context import StepContext
    from trainguard.recovery import Recovery
    from trainguard.recovery.ring import GoodStateRing
    from trainguard.recovery.state import SavedState as GoodState
    from trainguard.signals import StepSignals

log = logging.getLogger("trainguard")

LR_CAUSES = ("lr_too_high", "missing_warmup")
HISTORY = 64
"""Healthy steps kept for the baseline and the step time."""
MAX_ATTEMPTS = 3
DEFAULT_BUDGET_S = 60.0
"""The budget before the run has timed a step."""


class RunRecord(Protocol):
    """What a proof reads of the run's record (the run's `Journal`)."""

    @property
    def events(self) -> list[Event]: ...
    @property
    def findings(self) -> list[Finding]: ...
    @property
    def warmup_watch(self) -> object | None:
        """The preflight's warm-up finding while it waits for the first steps' LRs."""

    def emit_event(self, event: Event) -> None: ...


class Services(Protocol):
    """What a proof uses of the run's services (`pipeline.services.Services` has it): the user's
    objects to replay with. A protocol, as `RunState`: the prover is part of the run's state, and
    imports nothing of the pipeline that holds it."""

    @property
    def config(self) -> GuardConfig: ...
    @property
    def model(self) -> nn.Module: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...
    @property
    def scheduler(self) -> Any: ...
    @property
    def scaler(self) -> Any: ...
    @property
    def replay_fn(self) -> LossFn | None: ...
    @property
    def dist(self) -> DistributedContext | None: ...
    @property
    def step_rng(self) -> StepRNG | None: ...
    @property
    def fixes(self) -> Mapping[str, str]: ...


class RunState(Protocol):
    """What a proof reads of the run's state (`pipeline.state.RunState` has it): the good states
    it replays from, the step, and the run's record to rank with."""

    @property
    def step(self) -> int: ...
    @property
    def recovery(self) -> Recovery | None: ...
    @property
    def anchor(self) -> ProofAnchor | None: ...
    @property
    def journal(self) -> RunRecord: ...

    def good_states(self) -> GoodStateRing | None: ...

    def evidence_findings(self, step_findings: Iterable[Finding] = (),
                          closed: bool = False) -> list[Finding]: ...


class IncidentProver:
    """One per run, in its state (`RunState.prover`); its methods are handed the run's state and
    services (it holds neither). Its `state_dict` keeps what decides whether, and against what, a
    later incident is proved: the counts of proofs tried and the healthy baseline. Not kept: the
    batch references (the user's data; a window is only replayable from the ring's good states,
    which a resumed job starts afresh), the step times (this process's pace) and the proofs
    themselves, whose record is their `proof` events. A rollback rewinds none of it: what was
    proved stays proved, and the baseline holds only healthy steps."""

    def __init__(self) -> None:
        self.losses: deque[float] = deque(maxlen=HISTORY)
        self.norms: deque[float] = deque(maxlen=HISTORY)
        self.step_times: deque[float] = deque(maxlen=HISTORY)
        self.previous_batch: Any = None
        self.proofs: list[Proof] = []
        self.attempts = 0
        self.rollbacks_proved = 0
        self.warned_tried = False
        self.told_no_batch = False
        self._last_seen: float | None = None
        self.window: deque[WindowStep] = deque()
        """Every step since the oldest good state of the recover ring (references to its batch,
        its LRs): what a window replay from a good state replays."""

    # -- every step: two floats and a reference ----------------------------------------------------
    def see_calm(self, signals: StepSignals, batch: Any) -> None:
        """`see` of a calm step taken in the calm lane (no good-state ring, nothing raised)."""
        self.window.clear()
        now = time.perf_counter()
        if self._last_seen is not None:
            self.step_times.append(now - self._last_seen)
        self._last_seen = now
        if signals.loss is not None and math.isfinite(signals.loss):
            self.losses.append(float(signals.loss))
        if math.isfinite(signals.grad_norm):
            self.norms.append(float(signals.grad_norm))
        if batch is not None:
            self.previous_batch = batch

    def see(self, ctx: StepContext, services: Services | None = None,
            oldest_state: int | None = None) -> None:
        """Note the step; `oldest_state`: the step of the oldest good state a window replay can
        start from (None: no ring, nothing to keep)."""
        if oldest_state is None or services is None or ctx.batch is None:
            self.window.clear()
        else:
            while self.window and self.window[0].step < oldest_state:
                self.window.popleft()
            # the group LRs the step's one transfer brought (a tensor LR read here would wait
            # for the device)
            lrs = (ctx.signals.group_lrs if ctx.signals is not None and ctx.signals.group_lrs
                   else tuple(float(g["lr"]) for g in services.optimizer.param_groups))
            loss = ctx.signals.loss if ctx.signals is not None else None
            self.window.append(WindowStep(ctx.step, ctx.batch, lrs, ctx.applied, loss,
                                          ctx.forward_rng))
        now = time.perf_counter()
        if self._last_seen is not None:
            self.step_times.append(now - self._last_seen)
        self._last_seen = now
        signals = ctx.signals
        if signals is None or any(is_trouble(e.kind, e.severity) for e in ctx.events):
            return
        if signals.loss is not None and math.isfinite(signals.loss):
            self.losses.append(float(signals.loss))
        if math.isfinite(signals.grad_norm):
            self.norms.append(float(signals.grad_norm))
        if ctx.batch is not None:
            self.previous_batch = ctx.batch

    def baseline(self) -> Baseline:
        return Baseline.of(list(self.losses), list(self.norms))

    def baseline_dict(self) -> dict[str, float | None]:
        """The baseline a crash snapshot keeps for `trainguard prove`."""
        base = self.baseline()
        return {"loss": base.loss, "grad_norm": base.grad_norm}

    def state_dict(self) -> dict[str, Any]:
        return {"losses": list(self.losses), "norms": list(self.norms),
                "attempts": self.attempts, "rollbacks_proved": self.rollbacks_proved,
                "warned_tried": self.warned_tried, "told_no_batch": self.told_no_batch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name in ("losses", "norms"):
            values = state.get(name)
            if isinstance(values, list):
                kept: deque[float] = getattr(self, name)
                kept.clear()
                kept.extend(float(v) for v in values if isinstance(v, (int, float)))
        for name in ("attempts", "rollbacks_proved"):
            count = state.get(name)
            if isinstance(count, int) and not isinstance(count, bool):
                setattr(self, name, count)
        for name in ("warned_tried", "told_no_batch"):
            flag = state.get(name)
            if isinstance(flag, bool):
                setattr(self, name, flag)

    def step_time(self) -> float | None:
        """The median time of the recent steps (None: none timed yet)."""
        if not self.step_times:
            return None
        times = sorted(self.step_times)
        return times[len(times) // 2]

    def budget_s(self, services: Services) -> float:
        step = self.step_time()
        return DEFAULT_BUDGET_S if step is None else services.config.prove.budget_steps * step

    # -- on an incident ----------------------------------------------------------------------------
    def wanted(self, ctx: StepContext, services: Services) -> bool:
        if (services.config.prove.mode == "off" or services.replay_fn is None
                or ctx.decision is None
                or services.dist is not None):  # a replay's backward would all-reduce on one rank
            return False
        if not self._incident(ctx, services):
            return False
        if ctx.batch is None:  # a replay needs the step's batch: say so once, not silently
            if not self.told_no_batch:
                self.told_no_batch = True
                log.warning("trainguard: step %d is not proved by replay: no batch was given "
                            "for it (guard.step(loss, batch=batch)), and a replay needs the "
                            "step's batch", ctx.step)
            return False
        return True

    def _incident(self, ctx: StepContext, services: Services) -> bool:
        """Whether the step's incident is one to prove (`wanted`, the batch aside)."""
        mode = services.config.prove.mode
        assert ctx.decision is not None
        # a rollback halted instead is proved as the rollback it replaced
        action = ctx.decision.instead_of or ctx.decision.action
        if action == "halted":
            return True
        if action == "rolled_back":  # the rollback is the incident, whatever its events
            return self.rollbacks_proved == 0
        if mode != "on" or self.attempts >= MAX_ATTEMPTS:
            return False
        if any(at_least(e.severity, "error") for e in ctx.events):
            # a jump proved before (a warning: a heavy-tailed batch, say) does not stand for it
            return not any(p.reproduced and p.of_error for p in self.proofs)
        jumps = kinds_tagged(Tag.JUMP)
        if any(e.kind in jumps for e in ctx.events):  # an outlier batch (info) at once too
            return not any(p.reproduced and not p.warned for p in self.proofs)
        # a warning before any bad step (a precursor, a blown-up start): the first, before
        # anything else was proved (after a bad step the growth it warns of is the fault's)
        return not self.warned_tried and not self.proofs and _warned(ctx) is not None

    def prove(self, ctx: StepContext, state: RunState, services: Services,
              batch: Any = None) -> Proof | None:
        """Prove the step's incident; the proof, or None when it failed (logged)."""
        # a warning before any bad step is tried once, and takes no attempt of a later jump or
        # error
        warned = None if batch is not None or self._alarm(ctx) else _warned(ctx)
        if warned is None:
            self.attempts += 1
        else:
            self.warned_tried = True
        if ctx.decision is not None and "rolled_back" in (ctx.decision.action,
                                                          ctx.decision.instead_of):
            self.rollbacks_proved += 1
        try:
            events = state.journal.events + ctx.events
            likely = [c.code for c in rank_causes(
                events, state.evidence_findings(ctx.findings), top=100)]
            signals = ctx.signals
            finite = (None if signals is None
                      else bool(signals.loss_finite and signals.grads_finite))
            setup = self._setup(state, services, ctx.step,
                                batch if batch is not None else ctx.batch, finite)
            if batch is None:  # the step as it ran, on its batch, with its dropout masks
                setup.forward_rng = ctx.forward_rng
                if signals is not None and signals.loss is not None:
                    setup.original_loss = float(signals.loss)
            setup.earlier = _earlier(state, services)
            batch_kinds = kinds_tagged(Tag.BATCH)
            setup.batch_causes = tuple(str(e.details["cause"]) for e in ctx.events
                                       if e.kind in batch_kinds and e.details.get("cause"))
            started = time.perf_counter()
            with _replays(services):
                if warned is not None:
                    proofs = self._warned_proofs(ctx, state, services, setup, warned,
                                                    likely)
                    if not proofs:
                        return None
                else:
                    proofs = [prove(setup, likely=likely, budget_s=self.budget_s(services))]
                    first = proofs[0]
                    # a replay that does not compute what the run recorded cannot show the
                    # trouble from any state: no replay from a good state either
                    if (not first.reproduced or first.plain.forward_bad(first.baseline)) and (
                            state.recovery is not None or not first.confirmed) and (
                            not first.replay_differs):
                        # bad before its update: the damage is older; replay from the good
                        # state (the rollback's, whatever the step proved; else the anchor's,
                        # when the step proved nothing: its batch may be what is bad before
                        # the update)
                        left = self.budget_s(services) - (time.perf_counter() - started)
                        step_plain = first.plain if batch is None else None
                        proofs += self._from_good_state(ctx, state, services, setup, likely,
                                                        left, step_plain)
        except Exception as exc:  # proving is advisory: the run goes on
            log.error("trainguard: proving step %d failed (%s: %s)", ctx.step,
                      type(exc).__name__, exc)
            return None
        of_error = any(at_least(e.severity, "error") for e in ctx.events) or (
            ctx.decision is not None and ctx.decision.action in ("halted", "rolled_back"))
        for proof in proofs:
            proof.of_error = of_error
            self.proofs.append(proof)
            ctx.raise_event(proof_event(proof))
        self._refresh_likely(ctx, state, services)
        return proofs[-1]

    def _from_good_state(self, ctx: StepContext, state: RunState, services: Services,
                         setup: Setup, likely: list[str], budget_s: float,
                         step_plain: Outcome | None = None) -> list[Proof]:
        """Under `recover`, at a rollback: the same batch and LR replayed from the good state the
        rollback returns to (the state the trouble began from); everything is put back after,
        and the rollback then restores that state for good. Without a recover ring, from the
        proof anchor's newest good state before the loss left its level (`diagnose/anchor.py`).
        `step_plain`: the bad step replayed from its own state (the windows' record stands only
        when it gives the run's record of that step)."""
        if budget_s <= 0:
            return []
        recovery, anchor = state.recovery, state.anchor
        if recovery is not None:
            verdict = ctx.decision.verdict if ctx.decision is not None else None
            if verdict is None:
                return []
            ring = recovery.ring
            target = ring.latest_before(verdict.onset)
        elif anchor is not None and len(anchor.ring):
            ring = anchor.ring
            target = ring.latest_before(self._left_level(anchor.ring.good[0].step, ctx.step,
                                                         setup.baseline) - 1)
        else:
            return self._from_jump_state(ctx, state, services, setup, likely, budget_s)
        if target is None:
            return []
        lrs = [g["lr"] for g in services.optimizer.param_groups]
        with _put_back(services):
            damage = self._damage_loss(services, setup, target.step)
            self._restore(target, services, lrs)
            again = replace(setup, original_finite=None, original_loss=None,
                            state_step=target.step,
                            origin=f"from the good state of step {target.step}")
            started = time.perf_counter()
            proofs = [prove(again, likely=likely, budget_s=budget_s)]
            if not proofs[0].confirmed:
                # whatever the votes: an LR that built the damage up over the window is what
                # they miss most (its steps looked normal one by one)
                left = budget_s - (time.perf_counter() - started)
                proofs += self._windows(ctx, ring, target, services,
                                        replace(again, damage_loss=damage),
                                        proofs[0].plain.seconds / 2, left, lrs, step_plain)
            return proofs

    def _from_jump_state(self, ctx: StepContext, state: RunState, services: Services,
                         setup: Setup, likely: list[str], budget_s: float) -> list[Proof]:
        """Without good states: the step, on its batch and at its LRs, replayed from the state
        the proof anchor copied before the loop's last LR jump (`diagnose/anchor.py`), from
        before the damage the jumped LR did. No window: from the jump the only data from before
        the loss left its level is the jump step's batch."""
        lrs_now = ctx.signals.group_lrs if ctx.signals is not None else ()
        start = (state.anchor.jump_state(ctx.step, lrs_now) if state.anchor is not None
                 else None)
        if start is None:
            return []
        lrs = [g["lr"] for g in services.optimizer.param_groups]
        with _put_back(services):
            self._restore(start, services, lrs)
            return [prove(replace(setup, original_finite=None, original_loss=None,
                                  state_step=start.step,
                                  origin=f"from the state before the LR jump of step "
                                         f"{start.step}"), likely=likely, budget_s=budget_s)]

    @staticmethod
    def _alarm(ctx: StepContext) -> bool:
        """The step has a bad step's events (an error, a jump) or a rollback or halt."""
        jumps = kinds_tagged(Tag.JUMP)
        return (ctx.decision is not None and ctx.decision.action in ("halted", "rolled_back")
                ) or any(at_least(e.severity, "error") or e.kind in jumps for e in ctx.events)

    def _warned_proofs(self, ctx: StepContext, state: RunState, services: Services,
                       setup: Setup, warned: WarnedSignal, likely: list[str]) -> list[Proof]:
        """A warning before any bad step (a precursor, a blown-up start): the steps from the
        oldest good state whose window fits the budget (the run's record standing for the plain
        replay, one intervention at least) up to the warning step, replayed with the warned
        signal measured on that step (`diagnose/warned_signal.py`). Nothing when no good state
        is old enough to replay from, or the window was not kept whole."""
        ring, signals, per_step = state.good_states(), ctx.signals, self.step_time()
        if ring is None or signals is None or per_step is None:
            return []
        budget = self.budget_s(services)
        groups = len(services.optimizer.param_groups)
        for start in ring.good:  # the oldest first: the longest window has the most to show
            window = (self._window(start.step, ctx.step, groups)
                      if start.step < ctx.step else ())
            # the window, the bad step's update and one more forward, with a step to spare
            # for checking that the replay gives the run's losses (the record then stands for
            # the plain replay)
            if window and per_step * (len(window) + 3) <= budget:
                break
        else:
            return []
        lrs = [g["lr"] for g in services.optimizer.param_groups]
        recorded = recorded_window(window, signals.loss, signals.grad_norm)
        if recorded is not None:  # the run's value of the signal (of the loss: as replays judge it)
            recorded = replace(recorded, signal=recorded.loss if warned.signal == LOSS
                               else warned.value)
        with _put_back(services):
            self._restore(start, services, lrs)
            return [prove(replace(
                setup, window=window, state_step=start.step, update_seconds=per_step,
                recorded=recorded,
                baseline=replace(setup.baseline, signal_bound=warned.bound,
                                 signal_what=warned.what),
                warned=warned, rules_out=False, original_finite=None,
                original_loss=None,
                origin=f"steps {start.step}-{ctx.step} replayed from the good state of step "
                       f"{start.step}"), likely=likely, budget_s=budget)]

    def _windows(self, ctx: StepContext, ring: GoodStateRing, target: GoodState,
                 services: Services, setup: Setup, per_update: float, budget_s: float,
                 lrs: list[float], step_plain: Outcome | None = None) -> list[Proof]:
        """The window replays (`_starts`), each from its good state to the bad step, until one
        confirms something. The plain replay of a window is the run's record of it when the
        record shows the window bad and the replay computes what the run recorded at both of
        its ends (the window's first step: `prove`; the bad step, from its own state:
        `step_plain`): only the LR interventions are replayed then. Else each fix is compared
        with the window replayed as it happened."""
        signals = ctx.signals
        started = time.perf_counter()
        out: list[Proof] = []
        for start, rules_out in self._starts(ring, target, ctx.step, setup.baseline):
            window = self._window(start.step, ctx.step, len(lrs))
            recorded = None if signals is None or not window else recorded_window(
                window, signals.loss, signals.grad_norm)
            stands = (recorded is not None and record_stands(recorded, setup.baseline)
                      and step_plain is not None and signals is not None
                      and replays_record(step_plain, signals.loss, signals.grad_norm))
            left = budget_s - (time.perf_counter() - started)
            # room for LR x0.1 at least, and the plain window unless the record stands for it
            # (x0.01 only if the budget is left); a window is its steps, the bad step's update
            # and one more forward
            if not window or per_update * (len(window) + 2) * (1 if stands else 2) > left:
                continue
            self._restore(start, services, lrs)
            out.append(prove(replace(  # the bad step from its own RNG, as the window's steps
                setup, window=window, state_step=start.step,
                recorded=recorded if stands else None, update_seconds=per_update,
                rules_out=rules_out,
                origin=f"steps {start.step}-{ctx.step} replayed from the good state of step "
                       f"{start.step}"), budget_s=left))
            if out[-1].confirmed:
                break
        return out

    def _starts(self, ring: GoodStateRing, target: GoodState, stop: int,
                base: Baseline) -> list[tuple[GoodState, bool]]:
        """Where window replays start, with whether a replay from there that the LR does not heal
        rules the LR out: first the newest good state from before the first step whose recorded
        loss left the run's typical level, when newer than the rollback's (a shorter window; it
        may be inside the trouble already, so it rules nothing out), then the rollback's."""
        starts = [(target, True)]
        if base.loss is None:
            return starts
        first_bad = self._left_level(target.step, stop, base)
        newer = [s for s in ring.good
                 if target.step < s.step < first_bad and s.step <= stop - WINDOW_LAST]
        return [(newer[-1], False), *starts] if newer else starts

    def _damage_loss(self, services: Services, setup: Setup, step: int) -> float | None:
        """The loss of the model as it is (before the bad update) on the batch of `step`, from
        before the trouble, drawn with that step's RNG: whether the model itself is damaged
        (`Setup.damage_loss`). One forward; the RNG is put back by the caller's restore."""
        past = next((w for w in self.window if w.step == step), None)
        replay_fn = services.replay_fn
        if past is None or past.batch is None or replay_fn is None:
            return None
        if past.forward_rng is not None:
            put_torch_state(past.forward_rng)
        device = next(services.model.parameters()).device.type
        try:
            with torch.no_grad(), (torch.autocast(device, dtype=setup.autocast)
                                   if setup.autocast is not None else nullcontext()):
                loss = replay_fn(services.model, past.batch)
            return float(loss.detach().float())  # on an incident only: one sync
        except Exception:  # unmeasured: the window's LR heal counts as before
            return None

    def _left_level(self, start: int, stop: int, base: Baseline) -> int:
        """The first step from `start` to before `stop` whose recorded loss left the run's typical
        level (`stop` when none did, or there is no level yet)."""
        typical = base.loss
        if typical is None:
            return stop
        return next((w.step for w in self.window
                     if start <= w.step < stop and left_level(w, typical)), stop)

    @staticmethod
    def _restore(state: GoodState, services: Services, lrs: list[float]) -> None:
        """A good state into the model and optimizer, at the LR of the step that went bad."""
        optimizer = services.optimizer
        restore(state, model=services.model, optimizers=[optimizer], scheduler=None,
                scaler=None, rng=False)
        for group, lr in zip(optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr

    def _window(self, start: int, stop: int, groups: int) -> tuple[WindowStep, ...]:
        """The steps from `start` to before `stop`, all of them (else none): the window a
        replay from the good state of `start` goes through to reach `stop`."""
        window = tuple(w for w in self.window if start <= w.step < stop)
        if [w.step for w in window] != list(range(start, stop)) or any(
                len(w.lrs) != groups for w in window):
            return ()  # a step not seen, or a group added since: not as it happened
        return window

    def prove_now(self, state: RunState, services: Services, batch: Any = None) -> Proof:
        """On demand (`guard.prove()`), between steps: replay the next update from the state as
        it is, on `batch` (default: the last good batch), under every intervention that applies
        (the likely causes first, when there are any). Records the `proof` event."""
        batch = batch if batch is not None else self.previous_batch
        if services.replay_fn is None:
            raise UsageError("guard.prove() needs the loss: give the Guard replay_fn="
                             "lambda model, batch: ...")
        if batch is None:
            raise UsageError("guard.prove() needs a batch: none was seen yet, pass batch=")
        journal = state.journal
        likely = [c.code for c in rank_causes(journal.events, state.evidence_findings(),
                                              top=100)]
        setup = self._setup(state, services, state.step, batch, None)
        setup.incident = False
        setup.earlier = _earlier(state, services)
        with _replays(services):
            proof = prove(setup, likely=likely, budget_s=self.budget_s(services))
        self.proofs.append(proof)
        journal.emit_event(proof_event(proof))
        return proof

    def data_fault(self, step: int) -> bool:
        """This step's proofs confirmed a bad batch and not the LR: its rollback skips the data
        and keeps the LR."""
        confirmed = {c for p in self.proofs if p.step == step and p.reproduced
                     for c in p.confirmed}
        return bool(confirmed & set(DATA_CAUSES)) and not confirmed & set(LR_CAUSES)

    def precision_fault(self, step: int) -> Event | None:
        """Faults that came back after an earlier proof confirmed a float16 overflow will keep
        coming under float16, and trainguard cannot change the precision: the `precision_fault`
        event that halts the run at `step` instead of a rollback, with what to do (None: no
        such proof; `decide` halts with it only when the step would roll back)."""
        earlier = next((p for p in self.proofs if p.reproduced and p.step < step
                        and "fp16_overflow" in p.confirmed), None)
        if earlier is None:
            return None
        return Event(kind="precision_fault", step=step, severity="critical",
                     message=f"faults came back after the replay of step {earlier.step} confirmed "
                             f"a float16 overflow ({earlier.confirmed['fp16_overflow']}): switch "
                             "to bf16 (torch.autocast(dtype=torch.bfloat16), no GradScaler) or "
                             "fp32; trainguard cannot change the precision itself",
                     details={"proved_at": earlier.step})

    def _setup(self, state: RunState, services: Services, step: int, batch: Any,
               finite: bool | None) -> Setup:
        suspects = tuple(str(f.evidence["param"]) for f in state.journal.findings
                         if f.check == "layer_init" and "param" in f.evidence)
        assert services.replay_fn is not None
        return Setup(model=services.model, optimizer=services.optimizer,
                     loss_fn=services.replay_fn, batch=batch, step=step,
                     previous_batch=self.previous_batch,
                     autocast=torch.float16 if services.scaler is not None else None,
                     baseline=self.baseline(), original_finite=finite, init_suspects=suspects,
                     no_warmup=_no_warmup(state.journal, services))

    def _refresh_likely(self, ctx: StepContext, state: RunState, services: Services) -> None:
        ranked = rank_causes(state.journal.events + ctx.events,
                             state.evidence_findings(ctx.findings), top=3,
                             fixes=services.fixes)
        likely = likely_causes(ranked)
        for event in ctx.events:
            if likely and at_least(event.severity, "warning"):
                event.details["likely_causes"] = likely


def _warned(ctx: StepContext) -> WarnedSignal | None:
    """The signal of the step's warning before any bad step that a replay can measure (None:
    none)."""
    return next((signal for signal in map(WarnedSignal.of, ctx.events)
                 if signal is not None), None)


def _earlier(state: RunState, services: Services) -> str:
    """What would give this run's proof a state from before the damage (`Setup.earlier`)."""
    if state.good_states() is not None:
        return "a replay from one of the good states the run keeps (from before the damage)"
    deferred = services.config.sync == "deferred"
    return ('prove="on"' + (' with sync="blocking"' if deferred else "")
            + ", which keeps good states from before the damage to replay from,")


def _no_warmup(journal: RunRecord, services: Services) -> bool | None:
    """Whether the schedule lacks a warm-up, as the preflight judged (None: not judged)."""
    if journal.warmup_watch is not None or any(f.cause == "missing_warmup"
                                               for f in journal.findings):
        return True  # found, or held back while the first steps' LRs decide it
    return False if services.config.probes.preflight and services.scheduler is not None else None


@contextmanager
def _put_back(services: Services) -> Iterator[None]:
    """Around replays from a good state: the model, optimizer, gradients and RNG as they are now
    afterwards, in the optimizer's own state and group objects (loading the good state gives it
    new ones; the run's, and anything holding them, must see the same objects after)."""
    optimizer = services.optimizer
    keep = ReplayState(services.model, optimizer)
    state, groups = optimizer.state, optimizer.param_groups
    try:
        yield
    finally:
        try:
            optimizer.state, optimizer.param_groups = state, groups
        except AttributeError:  # a wrapper without setters: its values are put back below
            pass
        keep.restore()


def _replays(services: Services) -> AbstractContextManager[None]:
    """Around a proof: its replayed forwards leave the RNG state kept for the step under way."""
    return services.step_rng.kept() if services.step_rng is not None else nullcontext()


def proof_event(proof: Proof) -> Event:
    """The `proof` event the cause ranking reads: what was confirmed and ruled out, and why."""
    return Event(kind="proof", step=proof.step, severity="info",
                 message=f"step {proof.step} replayed: {proof.summary()}",
                 details={"confirmed": dict(proof.confirmed),
                          "confirmed_by": dict(proof.confirmed_by),
                          "ruled_out": dict(proof.ruled_out),
                          "reproduced": proof.reproduced, "faithful": proof.faithful,
                          "incident": proof.incident, "window": proof.window,
                          "damage_loss": proof.damage_loss, "undamaged": proof.undamaged,
                          "warned": proof.warned,
                          "not_tried": list(proof.not_tried),
                          "cannot_try": list(proof.cannot_try),
                          # the replay does not compute what the run recorded (a loss scaled
                          # or reduced outside the loss function): for the cause ranking
                          "replay_differs": proof.replay_differs,
                          "recorded_loss": proof.recorded_loss,
                          "replayed_loss": proof.plain.loss,
                          "seconds": round(proof.seconds, 3),
                          "trials": [{"name": i.name, "healed": healed, "loss": o.loss,
                                      "after": o.after, "grad_norm": o.grad_norm,
                                      "signal": o.signal}
                                     for i, o, healed in proof.trials]})
