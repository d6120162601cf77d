"""How often the good-state ring takes a candidate: as often as its cost allows.

A fixed interval is wrong both ways: every 50 steps throws away up to 50 steps of progress on a
rollback (a NaN burst at step 30 of a fine-tune rolls back to step 0), and every step would cost
a full copy of model and optimizer state per step. Here the interval is the shortest of
`INTERVALS` (up to `RecoveryConfig.ring_every`) at which the measured cost of a capture stays
within `RecoveryConfig.ring_budget` of the measured step time:

    capture_seconds / (interval * step_seconds) <= budget

Both are exponential moving averages of wall time (a capture's copies to host memory; the time
between two applied updates, which includes the data loading and the forward/backward). The
intervals are few and coarse (5, 10, 25, 50), so the choice does not flicker with timing noise.
Early in a run, where fine-tunes most often break, the shortest applies whatever it costs: for
the first `ring_every` steps a candidate is taken every 5 steps (at most 10 captures), so a fault
at step 30 loses at most about 10 steps. The first capture, before training, is not counted: it
allocates the host buffers that later captures reuse. Under torch.distributed every rank must
capture at the same steps: each rank's choice rides the step's all-reduce and the longest one
applies everywhere (`agree`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainguard.recovery.ring import GoodStateRing
    from trainguard.recovery.state import SavedState

log = logging.getLogger("trainguard")

INTERVALS = (5, 10, 25, 50)
"""The candidate intervals, shortest first (capped by `ring_every`)."""
SMOOTHING = 0.2


class RingCadence:
    """`budget=None`: a fixed cadence, every `max_every` steps."""

    def __init__(self, max_every: int, budget: float | None) -> None:
        self.max_every = max_every
        self.budget = budget
        self.capture_s: float | None = None
        self.step_s: float | None = None
        self.agreed: int | None = None
        """The interval every rank agreed on at the last step (None: a single process)."""

    def intervals(self) -> list[int]:
        shorter = [i for i in INTERVALS if i < self.max_every]
        return [*shorter, self.max_every]

    def observe_capture(self, seconds: float) -> None:
        self.capture_s = _ema(self.capture_s, seconds)

    def observe_step(self, seconds: float) -> None:
        if seconds > 0 and math.isfinite(seconds):
            self.step_s = _ema(self.step_s, seconds)

    def wished(self, step: int) -> int:
        """This process's interval at `step`, from its own measurements."""
        options = self.intervals()
        if self.budget is None:
            return self.max_every
        if step < self.max_every:  # early in the run
            return options[0]
        if self.capture_s is None or self.step_s is None or self.step_s <= 0:
            return options[0]
        budget = self.budget
        for interval in options:
            if self.capture_s <= budget * interval * self.step_s:
                return interval
        return options[-1]

    def agree(self, wishes: list[float]) -> None:
        """Every rank's wish, read from the step's all-reduce: the longest applies to all."""
        finite = [int(w) for w in wishes if math.isfinite(w) and w >= 1]
        self.agreed = max(finite) if finite else None

    def interval(self, step: int) -> int:
        return self.agreed if self.agreed is not None else self.wished(step)


class RingFeeder:
    """Offers a ring its candidates at the cadence's interval, timing the applied steps and the
    captures the cadence weighs (the recover ring's and the proof anchor's)."""

    def __init__(self, ring: GoodStateRing, cadence: RingCadence) -> None:
        self.ring = ring
        self.cadence = cadence
        self.last_capture = 0
        self._last_applied: float | None = None

    def after_applied(self, step: int, take: Callable[[SavedState | None], SavedState],
                      what: str) -> None:
        """After an applied update (`step`: the state's, the next update's): `take(reuse)`
        captures the state when one is due; a failed copy is logged (`what` it was for)."""
        now = time.perf_counter()
        if self._last_applied is not None:
            self.cadence.observe_step(now - self._last_applied)
        self._last_applied = now
        if step - self.last_capture < self.cadence.interval(step):
            return
        self.last_capture = step
        try:
            self.ring.offer(take(self.ring.take_spare()))
        except Exception as exc:  # a failed copy only costs a rollback point or a proof's start
            log.error("trainguard: could not keep %s at step %d (%s: %s)", what, step,
                      type(exc).__name__, exc)
        self.cadence.observe_capture(time.perf_counter() - now)
        self._last_applied = time.perf_counter()  # the capture is not the step's time


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new
