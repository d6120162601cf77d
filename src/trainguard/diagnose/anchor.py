"""States a proof starts from when the run keeps no recover ring.

A fault whose damage built up over several steps (an LR that jumped, a ramp) is bad before the
update of the step that raises the error: replaying that one step under a lower LR heals nothing,
since the state it starts from is already broken. Under `recover` the good-state ring holds the
state from before the trouble, and a window replay from it proves the LR (`diagnose/incidents.py`).
Without one the run keeps states of its own for that purpose, never rolled back to:

    good states   with `GuardConfig(prove={"mode": "on"})` (protect, observe, halt): a small ring
    with
                  the recover ring's candidates, checks and cadence (`recovery/ring.py`,
                  `recovery/cadence.py`), only `ANCHOR_SIZE` deep; at an alarm the newest good
                  state is pinned (kept past its turn: one copy more at most), so that a later
                  alarm of the same trouble still replays from before it. It costs a copy of
                  the weights and optimizer state in host memory at the ring's measured cadence
                  (`benchmarks/anchor_cost.py`).
    an LR jump    otherwise, where a halt proves its step (`prove="auto"` under halt and
                  protect): when the loop raised a group's LR `LR_JUMP` times or more in one
                  step (`lr_change`), the state from before that update, from which the proof
                  replays the bad step (the fault most often met, and one whose damage is done
                  by the updates after it). One copy, taken before the update, replayed from
                  once its finite flag (riding the next step's transfer) reads 1 and while the
                  raised LR is in force (a spike the loop took back leaves the step at the
                  usual LR, which shows nothing replayed from before the spike), given back
                  `prove.budget_steps` steps after the jump (the span a pinned good state is
                  kept for) or at the next jump (whose copy reuses its buffers). A run whose LR
                  never jumps keeps nothing. No window is replayed from it: starting at the
                  jump, the only data from before the loss left its level is the jump step's
                  own batch, and a window replayed on one batch over and over fits it whatever
                  the LR.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from trainguard.events import Event, at_least
from trainguard.recovery.cadence import RingCadence, RingFeeder
from trainguard.recovery.ring import GoodStateRing
from trainguard.recovery.state import SavedState, capture
from trainguard.registry import Kind, Tag, is_rank_local, is_trouble, kinds_tagged
from trainguard.transfer import to_host

if TYPE_CHECKING:
    from torch import nn

    from trainguard.config import GuardConfig

log = logging.getLogger("trainguard")

ANCHOR_SIZE = 2
"""Good states kept: the newest from before the trouble and one older (a window replay starts
from the newest before the loss left its level)."""
ANCHOR_FLAG = "anchor_finite"
"""Name of the candidate's finite flag in the step's packed transfer."""
LR_JUMP = 10.0
"""A group's LR raised this many times in one step keeps the state from before that update: a
rise the proof's lower LRs (x0.1, x0.01) take back whole. Smaller rises are the votes' to
weigh."""
JUMP_FLAG = "anchor_jump_finite"
"""Name of the finite flag of the state copied before an LR jump, in the next step's transfer."""
JUMPED = "jumped_lrs"
"""The copy's note of the groups the jump raised, with the LR each was raised to."""


class ProofAnchor:
    @staticmethod
    def wanted(config: GuardConfig) -> bool:
        """Whether the run proves incidents an anchor serves: every incident (`prove="on"`),
        or its halts (`prove="auto"` under a policy that can halt; observe never does). The
        recover policy's ring serves its own proofs."""
        return config.policy != "recover" and (
            config.prove.mode == "on"
            or (config.prove.mode == "auto" and config.policy != "observe"))

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 config: GuardConfig) -> None:
        self.model = model
        self.optimizer = optimizer
        recovery = config.recovery
        self.every_state = config.prove.mode == "on"
        """Good states at the ring's cadence; else the state before an LR jump."""
        self.ring = GoodStateRing(ANCHOR_SIZE, recovery.confirm_steps)
        self.horizon = config.prove.budget_steps
        self.pinned_at: int | None = None
        """The step of the alarm the pinned state is from before."""
        self.feeder = RingFeeder(self.ring, RingCadence(recovery.ring_every,
                                                        recovery.ring_budget))
        self.before_jump: SavedState | None = None
        """The state from before the last LR jump's update, its finite flag read as 1."""
        self.unread: SavedState | None = None
        """That state, copied, until the next step's transfer brings its finite flag."""

    @property
    def good_states(self) -> GoodStateRing | None:
        """The ring of good states (None: only the state before an LR jump is kept)."""
        return self.ring if self.every_state else None

    def start(self, step: int) -> None:
        """The state training starts from, checked directly, as the first good state (with
        every state)."""
        if not self.every_state:
            return
        self.feeder.last_capture = step
        try:
            state = self._capture(step)
        except Exception as exc:  # a proof without an anchor proves single steps, as before
            log.error("trainguard: could not keep the state a proof starts from (%s: %s)",
                      type(exc).__name__, exc)
            return
        finite = state.finite is None or bool(to_host(state.finite.reshape(1))[0] == 1.0)
        self.ring.promote_now(state, finite=finite)

    def extra(self) -> dict[str, torch.Tensor]:
        flags: dict[str, torch.Tensor] = {}
        flag = self.ring.pending_flag()
        if flag is not None:
            flags[ANCHOR_FLAG] = flag
        if self.unread is not None and self.unread.finite is not None:
            flags[JUMP_FLAG] = self.unread.finite
        return flags

    def before_update(self, events: list[Event], step: int, lrs: Sequence[float]) -> None:
        """Before the update of a step whose LR jumped `LR_JUMP` times or more (`lr_change`;
        `lrs`: the step's group LRs): copy the state as it is, into the buffers of the jump
        before (one copy at a time). A failed copy is logged: the proof then starts where it
        can, as before. With good states the ring serves instead."""
        jump = next((e for e in events if e.kind == Kind.LR_CHANGE
                     and float(e.details.get("ratio", 0.0)) >= LR_JUMP), None)
        if self.every_state or jump is None:
            return
        reuse = self.unread if self.unread is not None else self.before_jump
        self.unread = self.before_jump = None
        try:
            state = self._capture(step, reuse=reuse)
        except Exception as exc:
            log.error("trainguard: could not keep the state from before the LR jump of step %d "
                      "(%s: %s)", step, type(exc).__name__, exc)
            return
        groups = [int(g) for g in jump.details.get("groups", ()) if 0 <= int(g) < len(lrs)]
        state.extra[JUMPED] = {g: float(lrs[g]) for g in groups}
        self.unread = state

    def read(self, extra: dict[str, np.ndarray], step: int) -> None:
        """At `step`, with its transfer and before its proof: the state copied before an LR jump
        can be replayed from once its finite flag reads 1 (a state that is not finite is
        dropped); it is given back `prove.budget_steps` steps after the jump."""
        state = self.unread
        if state is not None:
            flag = extra.get(JUMP_FLAG)
            if flag is not None or state.finite is None:
                self.unread = None
                if flag is None or bool(np.all(flag == 1.0)):  # NaN-safe: NaN != 1
                    state.finite = None  # the device flag is no longer needed
                    self.before_jump = state
        if self.before_jump is not None and step - self.before_jump.step > self.horizon:
            self.before_jump = None

    def jump_state(self, step: int, lrs: Sequence[float]) -> SavedState | None:
        """The state from before the last LR jump a replay of `step` (at its group LRs `lrs`)
        can start from: while a group the jump raised is still within `LR_JUMP` of the LR it
        was raised to. A spike the loop took back runs the step at the usual LR, which replayed
        from before the spike shows nothing of it."""
        state = self.before_jump
        if state is None or state.step > step:
            return None
        jumped: dict[int, float] = state.extra.get(JUMPED, {})
        in_force = any(g < len(lrs) and lrs[g] * LR_JUMP > lr for g, lr in jumped.items())
        return state if in_force else None

    def observe(self, extra: dict[str, np.ndarray], events: list[Event], applied: bool, *,
                step: int) -> None:
        """After the step's decision: a candidate becomes good after `confirm_steps` applied
        steps without a warning, once its finite flag (read with the step's transfer) is 1."""
        if not self.every_state:
            return
        shared = [e for e in events if not is_rank_local(e.kind)]
        calm = applied and not any(is_trouble(e.kind, e.severity) for e in shared)
        jumps = kinds_tagged(Tag.JUMP)
        alarms = [e.step for e in shared if at_least(e.severity, "error") or e.kind in jumps]
        if self.pinned_at is not None and step - self.pinned_at > self.horizon:
            self.pinned_at = None  # out of a window's reach: the state takes its turn
            self.ring.pin(None)
        if alarms:
            self._pin_before(max(alarms))
        self.ring.observe(flag=extra.get(ANCHOR_FLAG), calm=calm)

    def _pin_before(self, step: int) -> None:
        """At an alarm (an error, a jump: what a proof is made for): the newest good state stays
        until the trouble is out of a window's reach. States taken after the alarm can pass as
        good (its damage done, the steps after it raised nothing yet), and newer ones would push
        the last state from before it out of so small a ring; a later alarm's window replay
        would then start inside the damage, where a lower LR heals nothing. The pin holds for
        `prove.budget_steps` steps (a window from further back does not fit the budget: a later
        incident's proof starts from the ring's newest states again), later alarms inside that
        span included."""
        if self.pinned_at is not None:
            return
        self.pinned_at = step
        self.ring.pin(self.ring.good[-1] if self.ring.good else None)

    def after_applied(self, step: int) -> None:
        """After an applied update (`step`: the state's step, the next update's): a candidate at
        the cadence's interval (with every state)."""
        if self.every_state:
            self.feeder.after_applied(step, lambda reuse: self._capture(step, reuse=reuse),
                                      "the state a proof starts from")

    def restart(self, step: int) -> None:
        """After a resume or a change of parameter groups: start again from the state as it is
        (a state from before them holds other groups)."""
        self.ring.discard_after(-1)
        self.unread = self.before_jump = None
        self.pinned_at = None
        self.start(step)

    def _capture(self, step: int, reuse: SavedState | None = None) -> SavedState:
        return capture(step=step, model=self.model, optimizers=[self.optimizer], scheduler=None,
                       scaler=None, guard_state={}, rng=False, reuse=reuse)
