"""Good states a proof starts from when the run keeps no recover ring.

A fault whose damage built up over several steps (an LR that jumped, a ramp) is bad before the
update of the step that raises the error: replaying that one step under a lower LR heals nothing,
since the state it starts from is already broken. Under `recover` the good-state ring holds the
state from before the trouble, and a window replay from it proves the LR (`diagnose/incidents.py`).
Under `protect`, `observe` or `halt` with `GuardConfig(prove="on")` the run keeps a small ring of
its own for that purpose: the same candidates, checks and cadence as the recover ring
(`recovery/ring.py`, `recovery/cadence.py`), only `ANCHOR_SIZE` deep, never rolled back to;
at an alarm the newest good state is pinned (kept past its turn: one copy more at most), so
that a later alarm of the same trouble still replays from before it. It
costs a copy of the weights and optimizer state in host memory, at the ring's measured cadence
(`benchmarks/anchor_cost.py`); it is built only when proofs were asked for on every incident.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

from trainguard.events import Event, at_least
from trainguard.recovery.cadence import RingCadence, RingFeeder
from trainguard.recovery.ring import GoodStateRing
from trainguard.recovery.state import SavedState, capture
from trainguard.registry import Tag, is_rank_local, is_trouble, kinds_tagged
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


class ProofAnchor:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 config: GuardConfig) -> None:
        self.model = model
        self.optimizer = optimizer
        recovery = config.recovery
        self.ring = GoodStateRing(ANCHOR_SIZE, recovery.confirm_steps)
        self.horizon = config.prove_budget_steps
        self.pinned_at: int | None = None
        """The step of the alarm the pinned state is from before."""
        self.feeder = RingFeeder(self.ring, RingCadence(recovery.ring_every,
                                                        recovery.ring_budget))

    def start(self, step: int) -> None:
        """The state training starts from, checked directly, as the first good state."""
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
        flag = self.ring.pending_flag()
        return {ANCHOR_FLAG: flag} if flag is not None else {}

    def observe(self, extra: dict[str, np.ndarray], events: list[Event], applied: bool, *,
                step: int) -> None:
        """After the step's decision: a candidate becomes good after `confirm_steps` applied
        steps without a warning, once its finite flag (read with the step's transfer) is 1."""
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
        `prove_budget_steps` steps (a window from further back does not fit the budget: a later
        incident's proof starts from the ring's newest states again), later alarms inside that
        span included."""
        if self.pinned_at is not None:
            return
        self.pinned_at = step
        self.ring.pin(self.ring.good[-1] if self.ring.good else None)

    def after_applied(self, step: int) -> None:
        """After an applied update (`step`: the state's step, the next update's): a candidate at
        the cadence's interval."""
        self.feeder.after_applied(step, lambda reuse: self._capture(step, reuse=reuse),
                                  "the state a proof starts from")

    def restart(self, step: int) -> None:
        """After a resume or a change of parameter groups: start again from the state as it is."""
        self.ring.discard_after(-1)
        self.pinned_at = None
        self.start(step)

    def _capture(self, step: int, reuse: SavedState | None = None) -> SavedState:
        return capture(step=step, model=self.model, optimizers=[self.optimizer], scheduler=None,
                       scaler=None, guard_state={}, rng=False, reuse=reuse)
