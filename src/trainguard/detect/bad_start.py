"""`bad_start`: the first steps went wrong, seen once the run has settled a little.

Checked once, at step `warmup_steps`: the first loss (the only one measured before any update)
against the median of the losses since step `warmup_steps // 2`.

- Far *above* that level (`detectors.bad_start.ratio`, 10x): a newly added layer initialised far too
  large (a classification head drawn with std 10 instead of 0.02) makes the first losses enormous;
  the optimizer then shrinks it and the loss falls to a normal level, so nothing looks wrong
  afterwards, yet the first large updates have already disturbed the pre-trained weights. Not
  for a preference objective (the first step's metrics carry the chosen and rejected rewards:
  DPO, KTO): it compares the policy with its reference, a copy of it, so its first value is
  ln 2 whatever the initialisation, and a loss that falls far from there has learned the
  preferences, not shed a bad layer (DPO at beta 2 goes 0.693 -> 1e-9 in ten steps).
- Far *below* it (`detectors.bad_start.blowup_ratio`, 2x): the very first updates made the model
  worse and it stayed worse: a learning rate far too high for the start (or no warmup). Then, at
  step `baseline_window`, if the loss is still `detectors.loss_divergence.ratio` times the first
  loss and has not come down to half its level of step `warmup_steps`, the blow-up has not faded as
  a warm-up fault does: a second event says the LR itself is too high.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from trainguard.detect.base import Detector
from trainguard.detect.calm import SignalColumns
from trainguard.detect.settings import DetectorConfig
from trainguard.detect.trainer_metrics import CHOSEN_REWARD, REJECTED_REWARD
from trainguard.events import Event
from trainguard.signals import StepSignals


class BadStart(Detector):
    kind = "bad_start"
    reads = frozenset({"loss", "trainer_metrics"})
    judges_start = True

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.first: float | None = None
        self.recent: list[float] = []
        self.done = False
        self.blown_up = False
        """The blow-up was reported; its persistence is checked at step `baseline_window`."""
        self.blown_level: float | None = None
        """The loss level the blow-up was measured at (step `warmup_steps`)."""
        self.preference = False
        """The loss is a preference objective, ln 2 at the first step by construction."""

    def check(self, signals: StepSignals) -> list[Event]:
        cfg = self.config
        if signals.loss is None or not math.isfinite(signals.loss) or signals.loss <= 0:
            return []
        if self.done:
            return self._check_persistence(signals) if self.blown_up else []
        if self.first is None:
            self.first = signals.loss
            metrics = signals.trainer_metrics
            self.preference = CHOSEN_REWARD in metrics and REJECTED_REWARD in metrics
            return []
        if signals.step >= cfg.common.warmup_steps // 2:
            self.recent.append(signals.loss)
        if signals.step < cfg.common.warmup_steps or not self.recent:
            return []
        self.done = True
        settled = statistics.median(self.recent)
        ratio = self.first / settled
        if ratio >= cfg.bad_start.ratio and not self.preference:
            return [self.event(signals.step, "warning",
                               f"the run started at loss {self.first:.4g}, {ratio:.3g}x the "
                               f"{settled:.4g} it settled at by step {signals.step}: the first "
                               "updates were far too large (a badly initialised new layer?)",
                               value=self.first, ratio=ratio, settled=settled, cause="bad_init")]
        if settled >= cfg.bad_start.blowup_ratio * self.first:
            self.blown_up, self.blown_level = True, settled
            self.recent = []
            return [self.event(signals.step, "warning",
                               f"the loss went from {self.first:.4g} before the first update to "
                               f"{settled:.4g} by step {signals.step} ({settled / self.first:.3g}x)"
                               ": the first updates made the model worse and it stayed worse "
                               "(learning rate too high for the start?)",
                               value=settled, ratio=settled / self.first, first=self.first,
                               cause="lr_too_high", signal="loss",
                               bound=cfg.bad_start.blowup_ratio * self.first)]
        return []

    def skip_calm(self, columns: SignalColumns, start: int, end: int) -> int:
        """Once judged, with no blow-up to follow, every row is calm."""
        return end if self.done and not self.blown_up else start

    def _check_persistence(self, signals: StepSignals) -> list[Event]:
        cfg = self.config
        window = max(cfg.common.baseline_window - cfg.common.warmup_steps, 1)
        if signals.step > cfg.common.baseline_window - window // 5:
            self.recent.append(signals.loss)  # type: ignore[arg-type]
        if signals.step < cfg.common.baseline_window:
            return []
        self.blown_up = False
        level = statistics.median(self.recent) if self.recent else math.nan
        assert self.first is not None
        blown = self.blown_level if self.blown_level is not None else math.inf
        if not (level >= cfg.loss_divergence.ratio * self.first  # NaN-safe: no event
                and level > 0.5 * blown):  # fading: a warm-up fault, not the LR
            return []
        return [self.event(signals.step, "warning",
                           f"the loss is still {level:.4g} at step {signals.step}, "
                           f"{level / self.first:.3g}x its {self.first:.4g} before the first "
                           "update: the blow-up of the first steps has not faded as a warm-up "
                           "fault does (the learning rate is too high)",
                           value=level, ratio=level / self.first, first=self.first,
                           cause="lr_too_high", sustained=True)]

    def state_dict(self) -> dict[str, Any]:
        return {"first": self.first, "recent": list(self.recent), "done": self.done,
                "blown_up": self.blown_up, "blown_level": self.blown_level,
                "preference": self.preference}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.first = state["first"]
        self.recent = [float(v) for v in state["recent"]]
        self.done = bool(state["done"])
        self.blown_up = bool(state.get("blown_up", False))
        blown = state.get("blown_level")
        self.blown_level = float(blown) if blown is not None else None
        self.preference = bool(state.get("preference", False))
