"""Act before the spike: the LR brake that an `instability_precursor` warning pulls.

Under `protect`, `recover` and `halt` (`halt` is `protect` plus a halt at `recovery.halt_severity`,
which a warning is below by default), the step that raises the first warning is clipped at the run's
typical norm (the kind puts the adaptive clip in its alarm, `registry.Tag.CLIP_ALARM`) and its LR
is multiplied by `BRAKE_FACTOR`; the factor then goes back to 1 linearly over `BRAKE_STEPS`
applied updates (the brake is released), on top of whatever sets the LR (`recovery.lr.LRBackoff`,
which survives closed-form and chainable schedulers and a loop that writes the LR itself).

A warning that comes back (while the brake is released or after; for log Z also a further climb
reported within the same episode, `detect/output_growth.py`) says the run's LR is where
instability starts, not that one stretch of data was rough: the brake then holds an LR ceiling,
`BRAKE_FACTOR` x the LR in force at that warning, for the rest of the run (a schedule that decays
below it takes over again). Each further warning lowers the ceiling the same way, when what it
measures stands higher than at the warning that set the ceiling (the growth went on under it): a
warning at a level already seen under the ceiling is the instability the ceiling answers, and
lowering it again on each return would take the LR towards 0 while nothing grows (a memorising
run whose fixed batches give the same log Z every epoch). A schedule that
keeps raising the LR (a warmup without an end, a scheduler stepped per batch) otherwise brings
the spike back a few dozen updates later. No warning, no action: a run that never warns keeps
its schedule untouched.

Under `recover` the ceiling is kept by the recovery's own LR backoff (`Recovery.lr`), so that a
later rollback lowers it further rather than two backoffs scaling the same LR; the brake is not
pulled while that backoff ramps or holds a ceiling. Under `observe` there is no brake: the
warning only.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from trainguard.recovery.lr import LRBackoff

BRAKE_FACTOR = 0.5
BRAKE_STEPS = 20


class PrecursorBrake:
    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: Any,
                 factor: float = BRAKE_FACTOR, steps: int = BRAKE_STEPS,
                 keeper: LRBackoff | None = None) -> None:
        self.factor = factor
        self.steps = steps
        self.optimizer = optimizer
        self.backoff = LRBackoff([optimizer], [scheduler] if scheduler is not None else [],
                                 steps)
        self.keeper = keeper if keeper is not None else self.backoff
        """The backoff that holds the lasting ceiling (the recovery's under `recover`)."""
        self.pulled: list[int] = []
        """The steps at which the brake was pulled."""
        self.ceilings: list[float | None] = []
        """The LR ceilings the brake set, one per parameter group (empty: none)."""
        self.levels: dict[str, float] = {}
        """The highest level each warned signal (`signal param`) stood at when the ceiling was
        set or lowered: a return no higher leaves the ceiling as it is."""

    @property
    def active(self) -> bool:
        return self.backoff.active

    def pull(self, step: int, signal: str = "", level: float = math.nan) -> str | None:
        """Act on a warning at `step`, before its update: "brake" (the LR of this step halved,
        ramped back after) on the first warning, "ceiling" (a lasting ceiling at `factor` x the
        LR now) on a later one, unless a ceiling stands and the warned `signal` is at a `level`
        no higher than when the ceiling was set; None when nothing changed."""
        if self.ceilings and signal in self.levels and level <= self.levels[signal]:
            return None  # (a NaN level compares False: it lowers the ceiling as before)
        if not self.pulled:
            count = len(self.backoff.ceilings_now())
            self.backoff.begin(self.factor, [None] * count, [1.0] * count)
            self.pulled.append(step)
            return "brake"
        lrs = [_value(g["lr"]) for g in self.optimizer.param_groups]
        held = self.keeper.ceilings_now()
        ceilings = [None if lr is None else self.factor * lr for lr in lrs]
        ceilings = [c if h is None else (h if c is None else min(c, h))
                    for c, h in zip(ceilings, held, strict=True)]
        if all(c is None for c in ceilings) or ceilings == held:
            return None
        self._release()
        applied = list(self.keeper.applied) if self.keeper.active else [1.0] * len(ceilings)
        self.keeper.begin(1.0, ceilings, applied)
        self.ceilings = ceilings
        self.pulled.append(step)
        if math.isfinite(level):
            self.levels[signal] = max(level, self.levels.get(signal, -math.inf))
        return "ceiling"

    def _release(self) -> None:
        """Take this brake's own ramp off the LR (when the recovery keeps the ceiling)."""
        if self.keeper is self.backoff or not self.backoff.active:
            return
        count = len(self.backoff.ceilings_now())
        self.backoff.begin(1.0, [None] * count, list(self.backoff.applied))
        self.backoff.active = False

    def before_measure(self) -> list[str]:
        """Before the step's LR is read: put the factor back on an LR the loop wrote; returns
        what the loop did to a cut LR (`LRBackoff.enforce`)."""
        return self.backoff.enforce()

    def after_schedule(self) -> None:
        """After the scheduler step of an applied update: release the brake by one step."""
        self.backoff.step()

    def state_dict(self) -> dict[str, Any]:
        return {"backoff": self.backoff.state_dict(), "pulled": list(self.pulled),
                "ceilings": list(self.ceilings), "levels": dict(self.levels)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "backoff" in state:
            self.backoff.load_state_dict(state["backoff"])
        self.pulled = [int(s) for s in state.get("pulled", [])]
        self.ceilings = [None if c is None else float(c) for c in state.get("ceilings", [])]
        self.levels = {str(k): float(v) for k, v in (state.get("levels") or {}).items()}


def _value(lr: Any) -> float | None:
    """A group's LR as a number (a tensor LR read once, at a warning); None when unusable."""
    value = float(lr.item()) if isinstance(lr, torch.Tensor) else float(lr)
    return value if math.isfinite(value) and value > 0 else None
