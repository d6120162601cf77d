"""`kl_blowup`: the policy's KL to its reference model, non-finite or far above its own level.

A trainer with a KL term (GRPO or RLOO with `beta` > 0, KTO, PPO) logs that KL; it grows slowly
while the policy learns. A value many times its own median so far (at least
`detectors.kl_blowup.floor`) means the policy left its reference in one step: an update too
large (the LR), or a KL penalty too weak to hold it (`beta`). Which one, the run shows: a KL
that climbed for `DRIFT_STEPS` judged steps or more at an LR that did not rise meanwhile drifted
away unheld (`details["cause"]` `beta_too_low`); one that left within the first steps, or just
after the LR rose, was thrown by the updates (`lr_too_high`). A NaN or inf KL (the K3
estimator's `exp()` overflowing) is an error at once. Reported once per episode.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from trainguard.detect.base import Detector, Episode
from trainguard.detect.trainer_metrics import KL, first
from trainguard.events import Event
from trainguard.signals import StepSignals

HISTORY = 50
"""Recent finite KL values kept for the median."""
DRIFT_STEPS = 10
"""KL values judged before a blow-up for it to count as a drift rather than the first updates'."""
LR_ROSE = 1.5
"""The LR at the blow-up over the lowest of the drift's steps, past which the LR moved it."""


class KLBlowup(Detector):
    kind = "kl_blowup"
    reads = frozenset({"trainer_metrics"})
    idle_without = frozenset({"trainer_metrics"})

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.history: list[float] = []
        self.judged = 0
        """Finite KL values judged so far (the history keeps only the recent ones)."""
        self.lrs: list[float] = []
        """The LR of the last `DRIFT_STEPS` steps with a KL."""
        self.episode = Episode(config.common.rearm_steps)

    def check(self, signals: StepSignals) -> list[Event]:
        found = first(signals.trainer_metrics, KL)
        if found is None:
            return []
        name, value = found
        settings = self.config.kl_blowup
        if not math.isfinite(value):
            if self.episode.update(True):
                return [self.event(signals.step, "error",
                                   f"the KL to the reference model ({name}) is {value}",
                                   param=name, value=value, metric=name)]
            return []
        level = max(statistics.median(self.history), settings.floor) if self.history else None
        high = (level is not None and len(self.history) >= settings.warmup
                and value > settings.ratio * level)
        events: list[Event] = []
        if signals.lr is not None:
            self.lrs = [*self.lrs, signals.lr][-DRIFT_STEPS:]
        if self.episode.update(high):
            assert level is not None
            drifted = self.judged >= DRIFT_STEPS and not (
                self.lrs and self.lrs[-1] > LR_ROSE * min(self.lrs))
            how = (f"after {self.judged} steps at an LR that did not rise: the KL penalty did "
                   "not hold the policy near its reference" if drifted else
                   "the policy left its reference in a few updates")
            events.append(self.event(
                signals.step, "warning",
                f"the KL to the reference model ({name}) jumped to {value:.4g}, "
                f"{value / level:.3g}x its level so far ({level:.3g}): {how}", param=name,
                value=value, metric=name, level=level, judged=self.judged,
                cause="beta_too_low" if drifted else "lr_too_high"))
        self.judged += 1
        if not high:  # a blown-up KL does not become the level it is judged against
            self.history.append(value)
            del self.history[:-HISTORY]
        return events

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history), "judged": self.judged, "lrs": list(self.lrs),
                "episode": self.episode.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = [float(v) for v in state.get("history", [])]
        self.judged = int(state.get("judged", len(self.history)))
        self.lrs = [float(v) for v in state.get("lrs", [])]
        if "episode" in state:
            self.episode.load_state_dict(state["episode"])
