"""`output_collapse`: the model predicts the same thing for every input, when it did not before.

Read from the output probe on sampled steps. For class scores (a classifier's B x C logits, a
language model's B x T x V): at least `detectors.output_collapse.mode_share` (98%) of the
predictions over the batch are one class ("every sample predicted class 2"; a language model
repeating one token). For a continuous output (a denoiser's predicted noise, a regression): its
spread has fallen below 1/`detectors.output_collapse.std_ratio` of its recent level (the median of
the last sampled steps), or risen above `detectors.output_collapse.std_ratio` times it. A model
learning its output's scale changes it gradually between sampled steps; a collapse or an explosion
is a jump. Class predictions count only after the model was seen predicting varied classes *once it
had learned* (its loss at most `LEARNED_SHARE` of its first one): a fresh classifier often predicts
one class for everything before it learns, and a fresh language model passes through predicting its
most frequent token, which is no alarm.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from trainguard.detect.base import Detector
from trainguard.events import Event
from trainguard.signals import StepSignals

LEARNED_SHARE = 0.7
"""A loss at most this share of the first one: the model has learned something."""
MIN_PREDICTIONS = 16
"""Fewer predictions than this (a batch of two) say nothing about a collapse."""
RECENT_SAMPLES = 5
"""Sampled steps whose output spread sets the recent level of a continuous output."""
MIN_SAMPLES = 3


class OutputCollapse(Detector):
    kind = "output_collapse"
    reads = frozenset({"loss", "sampled"})
    reads_sampled_only = True

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.varied = False
        """Class predictions were seen spread over several classes, once the model learned."""
        self.first_loss: float | None = None
        self.learned = False
        self.recent_std: list[float] = []
        self.active = False

    def check(self, signals: StepSignals) -> list[Event]:
        loss = signals.loss
        if loss is not None and math.isfinite(loss) and loss > 0:
            if self.first_loss is None:
                self.first_loss = loss
            elif loss <= LEARNED_SHARE * self.first_loss:
                self.learned = True
        events = []
        for sample in signals.sampled:
            out = sample.output
            if not out:
                continue
            event = (self._classes(sample.step, out) if out.get("out_kind") == 1.0
                     else self._continuous(sample.step, out))
            if event is not None and not self.active:
                events.append(event)
            self.active = event is not None
        return events

    def _classes(self, step: int, out: dict[str, float]) -> Event | None:
        share, cls = out.get("out_mode_share", math.nan), out.get("out_mode_class", -1.0)
        if not math.isfinite(share) or out.get("out_count", 0.0) < MIN_PREDICTIONS:
            return None
        if share < self.config.output_collapse.mode_share:
            self.varied = self.varied or (self.learned and share < 0.9)
            return None
        if not self.varied:
            return None
        who = "every prediction" if share >= 0.999 else f"{share:.0%} of the predictions"
        return self.event(step, "warning",
                          f"{who} in the batch is class {int(cls)} (of {int(out['out_classes'])})"
                          ": the model predicts one class whatever the input (it predicted "
                          "varied classes before)", value=share, predicted_class=int(cls),
                          how="one_class")

    def _continuous(self, step: int, out: dict[str, float]) -> Event | None:
        std = out.get("out_std", math.nan)
        if not math.isfinite(std):
            return None  # non-finite outputs are the non-finite detectors' business
        recent = self.recent_std
        level = statistics.median(recent) if len(recent) >= MIN_SAMPLES else math.nan
        ratio = self.config.output_collapse.std_ratio
        how = what = ""
        if level > 0 and std < level / ratio:
            how, what = "collapsed", f"fell to {std:.3g} from {level:.3g}"
        elif level > 0 and std > level * ratio:
            how, what = "exploded", f"rose to {std:.3g} from {level:.3g}"
        else:
            recent.append(std)  # a collapsed or exploded spread does not become the level
            del recent[:-RECENT_SAMPLES]
            return None
        return self.event(step, "warning",
                          f"the model's output {how}: its spread {what} over the last sampled "
                          f"steps (x{std / level:.3g})", value=std, level=level, how=how)

    def state_dict(self) -> dict[str, Any]:
        return {"varied": self.varied, "recent_std": list(self.recent_std), "active": self.active,
                "first_loss": self.first_loss, "learned": self.learned}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.varied = bool(state["varied"])
        self.recent_std = [float(v) for v in state["recent_std"]]
        self.active = bool(state["active"])
        first = state.get("first_loss")
        self.first_loss = None if first is None else float(first)
        self.learned = bool(state.get("learned", False))
