"""What the proof of a warning that came before any bad step measures: its signal, replayed.

An `instability_precursor` warning comes before any bad step: the loss is still fine, a signal
that tends to come before a spike is not (the largest attention logit of a layer, log Z of the
output logits, Adam's g/sqrt(v) of a parameter; `detect/instability_precursor.py`). A blown-up
start (`bad_start`: the loss of the first steps settled at twice or more its value before the
first update) has no single bad step either: its signal is the loss of the last steps. The
proof (`diagnose/incidents.py`) replays the steps from a good state to the warning and measures
that one signal on the warning step's forward and backward (the loss: the median of the
window's last steps): the plain window must have it at or above the warning's bound (the run's
record of it stands for the plain replay when the window's first step replays to its recorded
loss, as for any window), and a change that keeps it under the bound heals the warning
(`diagnose/counterfactual.py`). The bound is the
detector's own least condition for "high", as the event gives it (`bound`), against the level
the run had then: what the run said, not a threshold fitted here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainguard.detect.attention_logits import SIGNAL as ATTENTION
from trainguard.detect.instability_precursor import SIGNAL as ADAM_RATIO
from trainguard.detect.output_growth import LOGZ
from trainguard.events import Event
from trainguard.probes.attention_logits import AttentionLogitProbe
from trainguard.probes.logz import LogZProbe
from trainguard.transfer import to_host

KINDS = frozenset({"instability_precursor", "bad_start"})
"""The warnings that come before any bad step."""
LOSS = "loss"
"""The signal of a blown-up start: the loss itself, as a window replay judges it (the median of
its last steps), which the replay measures without a probe."""
MEASURED = {ATTENTION: "the largest attention logit of {}", LOGZ: "log Z of the output logits",
            ADAM_RATIO: "Adam's g/sqrt(v) RMS of {}", LOSS: "the median loss of the last steps"}
"""The signals a replay measures -> how a sentence names them."""


@dataclass(frozen=True, slots=True)
class WarnedSignal:
    signal: str
    name: str
    """The layer or parameter the warning named ("logits" for log Z, "" for the loss)."""
    value: float
    """The signal at the warning step, as the run measured it."""
    bound: float
    """At or above it the detector calls the signal high (`Event.details["bound"]`)."""

    @classmethod
    def of(cls, event: Event) -> WarnedSignal | None:
        """The signal a warning before any bad step names; None for another event, a signal a
        replay does not measure, or a warning without its bound."""
        details = event.details
        signal, name, value, bound = (details.get("signal"), event.param or "", event.value,
                                      details.get("bound"))
        if (event.kind not in KINDS or signal not in MEASURED or not isinstance(name, str)
                or not isinstance(value, int | float) or not isinstance(bound, int | float)
                or not math.isfinite(bound)):
            return None
        return cls(str(signal), name, float(value), float(bound))

    @property
    def what(self) -> str:
        return MEASURED[self.signal].format(self.name)

    def start(self, model: nn.Module) -> Reading:
        """Before the warning step's forward: what measures the signal through it."""
        return Reading(self, model)


class Reading:
    """The signal over one forward and backward (`finish` after the backward, before the
    optimizer step: Adam's ratio is of the step's gradient against the moments before it)."""

    def __init__(self, signal: WarnedSignal, model: nn.Module) -> None:
        self.signal = signal
        self._attention: AttentionLogitProbe | None = None
        self._logz: LogZProbe | None = None
        if signal.signal == ATTENTION:
            self._attention = AttentionLogitProbe(model)
            self._attention.attach()
        elif signal.signal == LOGZ:
            self._logz = LogZProbe(model)

    def finish(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
        """The signal's value (NaN when it was not measured; the loss is the replay's own)."""
        try:
            if self._attention is not None:
                found = self._attention.detach()
                if found is None or self.signal.name not in found[0]:
                    return math.nan
                return float(found[1][found[0].index(self.signal.name)])
            if self._logz is not None:
                rows = self._logz.take()
                return (math.nan if rows is None
                        else float(self._logz.values(to_host(rows))[LOGZ][0]))
            if self.signal.signal == LOSS:
                return math.nan
            return adam_ratio(model, optimizer, self.signal.name)
        finally:
            self.close()

    def close(self) -> None:
        if self._attention is not None and self._attention.attached:
            self._attention.detach()
        if self._logz is not None:
            self._logz.close()


@torch.no_grad()
def adam_ratio(model: nn.Module, optimizer: torch.optim.Optimizer, name: str) -> float:
    """sqrt(sum g^2 / sum v_hat) of one parameter, v_hat = (v + eps^2) / (1 - beta2^t), from its
    gradient and the moments before the step (`probes/adam_ratio.py` carries the same value
    step to step); 0 before Adam has moments for it, NaN for a parameter it does not know."""
    param = dict(model.named_parameters()).get(name)
    if param is None or param.grad is None:
        return math.nan
    group: dict[str, Any] | None = next(
        (g for g in optimizer.param_groups if any(p is param for p in g["params"])), None)
    state = optimizer.state.get(param, {})
    if group is None or "betas" not in group:
        return math.nan
    moments, step = state.get("exp_avg_sq"), state.get("step")
    if moments is None or step is None:
        return 0.0
    beta2, eps = float(group["betas"][1]), float(group.get("eps", 1e-8))
    count = float(step)
    squares = param.grad.detach().double().square().sum()
    denominator = (moments.detach().double().sum() + moments.numel() * eps * eps) / (
        1.0 - beta2 ** count)
    return float((squares / denominator).sqrt())
