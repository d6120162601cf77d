"""Act before the spike: the LR brake that an `instability_precursor` warning pulls.

Under `protect` and `recover`, the step that raises the warning is clipped at the run's typical
norm (the kind puts the adaptive clip in its alarm, `registry.Tag.CLIP_ALARM`) and its LR is
multiplied by `BRAKE_FACTOR`; the factor then goes back to 1 linearly over `BRAKE_STEPS`
applied updates (the brake is released), on top of whatever sets the LR (`recovery.lr.LRBackoff`,
which survives closed-form and chainable schedulers and a loop that writes the LR itself). A
warning while the brake is on does not pull it again; the recover policy's own backoff after a
rollback takes precedence (the brake is not pulled while it is on). Under `observe` there is no
brake: the warning only.
"""

from __future__ import annotations

from typing import Any

import torch

from trainguard.recovery.lr import LRBackoff

BRAKE_FACTOR = 0.5
BRAKE_STEPS = 20


class PrecursorBrake:
    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: Any,
                 factor: float = BRAKE_FACTOR, steps: int = BRAKE_STEPS) -> None:
        self.factor = factor
        self.steps = steps
        self.backoff = LRBackoff([optimizer], [scheduler] if scheduler is not None else [],
                                 steps)
        self.pulled: list[int] = []
        """The steps at which the brake was pulled."""

    @property
    def active(self) -> bool:
        return self.backoff.active

    def pull(self, step: int) -> bool:
        """Halve the LR of the step about to be applied (and ramp back after); False when the
        brake is already on."""
        if self.backoff.active:
            return False
        count = len(self.backoff.ceilings_now())
        self.backoff.begin(self.factor, [None] * count, [1.0] * count)
        self.pulled.append(step)
        return True

    def before_measure(self) -> None:
        """Before the step's LR is read: put the factor back on an LR the loop wrote."""
        self.backoff.enforce()

    def after_schedule(self) -> None:
        """After the scheduler step of an applied update: release the brake by one step."""
        self.backoff.step()

    def state_dict(self) -> dict[str, Any]:
        return {"backoff": self.backoff.state_dict(), "pulled": list(self.pulled)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "backoff" in state:
            self.backoff.load_state_dict(state["backoff"])
        self.pulled = [int(s) for s in state.get("pulled", [])]
