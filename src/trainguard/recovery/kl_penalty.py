"""Hold the policy near its reference: the KL penalty (`beta`) raised when the run shows it weak.

A `kl_blowup` whose detector found the KL drifting away unheld (`details["cause"]`
`beta_too_low`: it climbed for many steps at an LR that did not rise) engages the controller
under `recover`: a stronger penalty trades reward for staying near the reference, a trade the
recover policy makes (`protect` and `observe` only warn). From then on it follows PPO's adaptive
KL rule (Schulman et al. 2017, section 4). Its target is the middle, on a log scale, of the range
the detector tolerates: between the run's KL level before the blow-up (the detector's
`details["level"]`, its median so far, at least `detectors.kl_blowup.floor`) and
`detectors.kl_blowup.ratio` times it, so that a KL that keeps growing slowly, as a learning
policy's does, is not pinned to where it started:

    KL above RAISE_ABOVE x target   beta x FACTOR
    KL below target / RAISE_ABOVE    beta / FACTOR, never below the beta the run was given

and beta never above `MAX_FACTOR` x the beta it was given: a KL that no penalty holds is the LR's
(the detector says so when the LR rose), and a penalty that large would drown the reward.

The coefficient lives where the loss reads it every step: `holder.beta` (a TRL trainer's, which
the HF callback finds; in a loop of one's own, any object whose `beta` the loss reads). A run
whose KL never drifts unheld never has its beta touched.
"""

from __future__ import annotations

import math
from typing import Any

from trainguard.errors import UsageError
from trainguard.events import Event

FACTOR = 2.0
"""PPO's adaptive rule doubles or halves its coefficient."""
RAISE_ABOVE = 1.5
"""The band around the target within which beta is left as it is (PPO's 1.5)."""
MAX_FACTOR = 4096.0
"""The largest multiple of the given beta the controller sets (twelve doublings)."""
CAUSE = "beta_too_low"
"""The `kl_blowup` cause that engages the controller."""


def holds_beta(holder: Any) -> bool:
    """Whether `holder.beta` is a finite positive number: a penalty to raise (a trainer at beta 0
    made no reference model, so no KL term exists to strengthen)."""
    beta = getattr(holder, "beta", None)
    return (isinstance(beta, (int, float)) and not isinstance(beta, bool)
            and math.isfinite(beta) and beta > 0)


def check_holder(holder: Any) -> None:
    """One clear error for a `kl_penalty` that holds no `beta` to read and raise (a number
    passed where the object the loss reads it from is wanted)."""
    if holder is None:
        return
    beta = getattr(holder, "beta", None)
    if not isinstance(beta, (int, float)) or isinstance(beta, bool):
        raise UsageError(
            f"kl_penalty must be the object whose `beta` attribute your loss reads every step "
            f"(a TRL trainer, or types.SimpleNamespace(beta=0.04)), got "
            f"{type(holder).__name__}" + ("" if beta is None else
                                          f" whose beta is a {type(beta).__name__}"))


class KLPenalty:
    def __init__(self, holder: Any, ratio: float) -> None:
        self.holder = holder
        self.ratio = ratio
        """`detectors.kl_blowup.ratio`: how far above its level the detector lets the KL go."""
        self.given: float | None = None
        """The beta the run had when the controller engaged (None: not engaged)."""
        self.target: float | None = None
        """The KL level the controller holds the policy at."""

    @property
    def engaged(self) -> bool:
        return self.target is not None

    @property
    def beta(self) -> float:
        return float(self.holder.beta)

    def follow(self, events: list[Event], kl: float | None) -> str | None:
        """One step's adjustment, after its events: a message for the action record when beta
        changed, else None. `kl`: the step's KL metric (None: not logged this step)."""
        if not self.engaged:
            blowup = next((e for e in events if e.kind == "kl_blowup"
                           and e.details.get("cause") == CAUSE), None)
            level = blowup.details.get("level") if blowup is not None else None
            if not isinstance(level, (int, float)) or not level > 0 or not holds_beta(
                    self.holder):
                return None
            self.given, self.target = self.beta, float(level) * math.sqrt(self.ratio)
        assert self.target is not None and self.given is not None
        if kl is None or not math.isfinite(kl):
            return None
        beta = self.beta
        if kl > RAISE_ABOVE * self.target:
            new = min(beta * FACTOR, MAX_FACTOR * self.given)
        elif kl < self.target / RAISE_ABOVE:
            new = max(beta / FACTOR, self.given)
        else:
            return None
        if new == beta:
            return None
        self.holder.beta = new
        how = "raised" if new > beta else "lowered"
        low, high = self.target / RAISE_ABOVE, self.target * RAISE_ABOVE
        return (f"KL penalty beta {how} {beta:.3g} -> {new:.3g}: the KL ({kl:.3g}) is "
                f"{'above' if new > beta else 'below'} the band it is held in "
                f"({low:.3g}-{high:.3g}); beta stays within {self.given:.3g} and "
                f"{MAX_FACTOR * self.given:.3g}")

    def state_dict(self) -> dict[str, Any]:
        return {"given": self.given, "target": self.target,
                "beta": self.beta if self.engaged else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        given, target, beta = state.get("given"), state.get("target"), state.get("beta")
        self.given = None if given is None else float(given)
        self.target = None if target is None else float(target)
        if beta is not None and holds_beta(self.holder):
            self.holder.beta = float(beta)  # a resumed run keeps the penalty it had reached
