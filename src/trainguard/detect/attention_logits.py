"""The attention-logit side of `instability_precursor`: logits that keep growing before a spike.

Reads `attention_logits` (`attn_logit_max` of `probes/attention_logits.py`): per attention layer,
the largest pre-softmax logit q.k / sqrt(d_head). Without QK-norm and at an LR too high, these
grow without bound (the weights of q and k grow together, so the logits grow as their product);
the softmax turns one-hot, its gradients vanish, and the loss spikes when attention collapses
(Dehghani et al. 2023, arXiv 2302.05442; Wortsman et al. 2023, arXiv 2304.13013: "attention
logit growth"). A healthy run's logits rise while attention sharpens, then hold.

A layer warns when its largest logit is at least `detectors.attention_logits.abs_min` and at least
`detectors.attention_logits.ratio` times its own median over its last `baseline_window`
measurements, for `detectors.attention_logits.steps` measurements in a row: growth that outran its
own recent level, at a height where the softmax is close to one-hot. It warns again when the logit
has grown by `detectors.attention_logits.ratio` again since its last warning (the growth goes on:
under protect each warning lowers the LR further), and stays silent while its baseline is young
(`detectors.attention_logits.warmup` measurements).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

from trainguard.detect.aftermath import AHEAD
from trainguard.detect.settings import DetectorConfig
from trainguard.detect.trend import since, trend
from trainguard.events import Event
from trainguard.signals import StepSignals

SIGNAL = "attn_logit_max"
EXPECTED_LEAD = "~100"
"""The lead the message announces: on the scenario suite's `tiny_attn` family the first warning
came 90-183 steps before the loss first doubled, median 163 over 6 seeds, and later ones closer
(`benchmarks/precursors.py`, docs/benchmarks.md)."""


class AttentionTrack:
    """One layer's history, streak and last warning."""

    def __init__(self, window: int) -> None:
        self.history: deque[float] = deque(maxlen=window)
        """The layer's log logits, one per measurement."""
        self.streak = 0
        self.first = math.nan
        """The logit at the measurement before the current streak began (for the trend)."""
        self.warned = math.nan
        """The logit at the layer's last warning (NaN: none yet)."""
        self.near = False
        """Whether its last measurement was within `NEAR` of where it may warn, or a streak is
        running: the probe then measures every step."""

    def state_dict(self) -> dict[str, Any]:
        return {"history": [float(v) for v in self.history], "streak": self.streak,
                "first": None if math.isnan(self.first) else self.first,
                "warned": None if math.isnan(self.warned) else self.warned, "near": self.near}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.clear()
        self.history.extend(float(v) for v in state.get("history", []))
        self.streak = int(state.get("streak", 0))
        self.near = bool(state.get("near", False))
        first, warned = state.get("first"), state.get("warned")
        self.first = math.nan if first is None else float(first)
        self.warned = math.nan if warned is None else float(warned)


NEAR = math.log(2.0)
"""A layer whose log logit is within this of both bounds (half of `abs_min`, half of `ratio`
times its median) is near them."""


class AttentionLogitTracker:
    """Composed by `InstabilityPrecursor`: its events are that detector's (`make` builds them),
    one kind whatever signal moved first."""

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self.layers: dict[str, AttentionTrack] = {}

    def check(self, signals: StepSignals, make: Any) -> list[Event]:
        """`make`: the detector's `event` method."""
        cfg = self.config
        found: list[tuple[float, str, float, float]] = []
        for name, value in signals.attention_logits.items():
            if not math.isfinite(value) or value <= 0:
                continue  # a NaN is other detectors' business; a non-positive max says nothing
            layer = self.layers.get(name)
            if layer is None:
                layer = self.layers[name] = AttentionTrack(cfg.common.baseline_window)
            log_value = math.log(value)
            if len(layer.history) < cfg.attention_logits.warmup:
                layer.history.append(log_value)
                continue
            level = statistics.median(layer.history)
            layer.history.append(log_value)
            above_floor = log_value - math.log(cfg.attention_logits.abs_min)
            above_level = log_value - level - math.log(cfg.attention_logits.ratio)
            high = above_floor >= 0 and above_level >= 0
            if not high:
                layer.streak = 0
                layer.near = above_floor >= -NEAR and above_level >= -NEAR
                continue
            layer.near = True
            if layer.streak == 0:  # the measurement before this one, where the rise began
                layer.first = (math.exp(layer.history[-2]) if len(layer.history) >= 2
                               else math.nan)
            layer.streak += 1
            again = math.isnan(layer.warned) or value >= cfg.attention_logits.ratio * layer.warned
            if layer.streak >= cfg.attention_logits.steps and again:
                found.append((log_value - level, name, value, math.exp(level)))
        if not found:
            return []
        _, name, value, typical = max(found)
        for _, other, other_value, _ in found:  # one event a step names every layer warned of
            self.layers[other].warned = other_value
        return [self._event(signals, make, name, value, typical)]

    def due(self, step: int) -> bool:
        """Whether the probe measures `step`: every step while a layer's baseline is young or a
        layer is near its bound, else every `detectors.attention_logits.every` steps (a healthy
        run's logits sit far below it and move slowly)."""
        every = self.config.attention_logits.every
        warmup = self.config.attention_logits.warmup
        return (every <= 1 or step % every == 0 or not self.layers
                or any(layer.near or len(layer.history) < warmup
                       for layer in self.layers.values()))

    def _event(self, signals: StepSignals, make: Any, name: str, value: float,
               typical: float) -> Event:
        layer = self.layers[name]
        rise = trend(value, layer.first)
        ratio = value / typical
        return make(
            signals.step, "warning",
            f"largest attention logit of {name} at {value:.3g}, {ratio:.3g}x its median "
            f"{typical:.3g}, above it for {layer.streak} measurements, "
            f"{since(rise, layer.first)}: attention logits that keep growing make the softmax "
            f"one-hot{AHEAD}{EXPECTED_LEAD} steps",
            param=name, value=value, signal=SIGNAL, layer=name, baseline=typical, ratio=ratio,
            bound=max(self.config.attention_logits.abs_min,
                      self.config.attention_logits.ratio * typical),
            steps_above=layer.streak, trend=rise, before=layer.first,
            expected_lead=EXPECTED_LEAD)

    def state_dict(self) -> dict[str, Any]:
        return {name: layer.state_dict() for name, layer in self.layers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.layers = {}
        for name, entry in state.items():
            layer = self.layers[name] = AttentionTrack(self.config.common.baseline_window)
            layer.load_state_dict(entry)
