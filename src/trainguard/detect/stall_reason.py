"""What a stalled run shows of why it did not learn: the evidence `no_progress` gathers over the
steps it judges, and the reason it names from it.

Gathered every step (a few numbers, and one flag per watched parameter): the LR the optimizer
used (the largest of its groups' LRs), whether any gradient came, which parameters got one; on
sampled steps, the update each parameter took (`update_ratio` of the weight probe,
||dW|| / ||W||), the parameters' sizes (the weight probe's statistics) and the width of the
model's class scores (the output probe's `out_classes`).

The reason, the first of these the run shows (each a statement of what was measured, with the
cause code it points at):

- no watched parameter got a gradient: nothing reaches the weights (`no_gradients`);
- the LR was 0 at every step, in every group (`lr_too_low`: a schedule or a config that leaves
  it at 0);
- the parameters that get gradients took no update at any measured step, while some groups'
  LR is 0 (`lr_too_low`: the LR of their groups);
- the LR fell, within those steps, to `LR_FELL` of the highest it had among them or below,
  and stayed there for half of them or more (`lr_too_low`: a schedule stepped per batch where
  it was written per epoch; the end of a cosine cycle passes by);
- the gradient norm the Guard read was one value (within `PIN_TOLERANCE`) at nearly every step
  judged, and the updates add up to less than `SLOW` of the typical weight's norm or the loss
  falls steadily but too slowly to count: what a
  `clip_grad_norm_` in the loop leaves when its `max_norm` is under every step's norm, each
  update scaled to that size whatever the loss asks (`clip_too_tight`; under Adam the scale
  cancels and the updates keep their size, so this reason does not show);
- a weight decay the preflight found taking 1% of every weight a step or more (`weight_decay`)
  moves each weight by at least `1 / DECAY_SHARE` of what the weights moved: the updates are
  mostly the decay's, which holds the weights small whatever the loss asks
  (`weight_decay_too_high`);
- the updates are too small to move the weights: the typical parameter's update, over the steps
  judged, adds up to less than `MOVED` of its norm even if every step pointed the same way
  (`lr_too_low`);
- the parameters that got a gradient are under `TRAINED_SHARE` of the watched weights: the rest
  are frozen or not reached by the loss (`no_gradients`);
- the loss sits at chance level, ln(C) for a model with C class scores (within
  `CHANCE_TOLERANCE`), with no downward trend, while the weights move and the gradients flow:
  what a model can do when the labels carry no signal of the inputs is to predict their
  marginal, the uniform guess for balanced labels, whatever it learns (`label_problem`);
- the loss falls steadily (a Kendall trend `TREND_Z` standard errors below none) while the
  typical update stays under `STEADY_STEP` of its weight's norm: each step helps and the steps
  are small for what is left to learn (`lr_too_low`; an LR too high throws the loss around
  rather than letting it fall steadily, or moves the weights by more).

Else the stall names no cause, and says what the run ruled out.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainguard.chance_level import chance_loss
from trainguard.detect.update_too_large import FROM_ZERO, SIGNAL, elements
from trainguard.signals import StepSignals

MOVED = 0.01
"""Updates that add up to less than this share of a weight's norm over the steps judged (at most:
the sum of the steps' ratios, as if all pointed the same way) cannot have moved the model. A
healthy step moves a weight by 0.1-1% of its norm: 100 steps add up to 10% or more."""
TRAINED_SHARE = 0.1
"""When the parameters that got a gradient hold less than this share of the watched weights,
the stall is the frozen rest's (a model frozen but for its norms or biases)."""
CHANCE_TOLERANCE = 0.02
"""A loss within this share of ln(C) sits at chance level: a model that learned anything of its
inputs is below it by more (a uniform guess scores ln(C) on every sample, without noise)."""
TREND_Z = 3.0
"""A loss at chance whose Kendall trend is this many standard errors below none is coming down
(slowly: an LR too low, or a model thrown around by one too high), not held there."""
NAMED = 3
"""Parameters named in a message."""
LR_FELL = 1e-3
"""An LR that fell to this share of the highest it had over the steps judged has left the
run nothing to train with, whatever the updates measured earlier in them."""
PIN_TOLERANCE = 1e-3
"""Gradient norms within this share of one value are that value: a clip to `max_norm` leaves
`max_norm * n / (n + 1e-6)`, which moves by under 1e-3 of it whenever the norm before the clip
`n` is above 1e-3; a batch's own noise moves a norm by percents from step to step."""
PINNED_SHARE = 0.9
"""The share of the steps judged at one gradient norm for the loop's clip to be a reason."""
SLOW = 0.1
"""Updates adding up to less than this share of a weight's norm over the steps judged are slow
enough for a clip that scales every one of them down to be why (`MOVED` is "none at all")."""
DECAY_SHARE = 2.0
"""A weight decay that alone moves every weight by at least half of what the typical weight
moved (the sampled update ratios) is what the updates are, more than the loss's gradients."""
STEADY_STEP = 0.01
"""A loss that falls steadily under updates below this share of their weight's norm a step (the
top of a healthy step's 0.1-1%) is held back by the step's size: a larger one would help more."""
SAMPLES = 16
"""The sampled updates kept (the steps judged hold `stall_steps / sample_every` of them)."""


def run_lr(signals: StepSignals) -> float | None:
    """The LR the optimizer used at the step: the largest of its groups' (a group at 0 beside
    one that trains is not a stall's LR), or the first group's when no group's is known."""
    finite = [lr for lr in signals.group_lrs if math.isfinite(lr)]
    return max(finite) if finite else signals.lr


@dataclass(frozen=True, slots=True)
class StallReason:
    cause: str | None
    """The cause code the evidence points at; None when the run shows none."""
    text: str
    """What the run showed, in words (the end of the event's message and of the verdict's)."""
    details: dict[str, Any] = field(default_factory=dict)


class StallEvidence:
    """The evidence of the steps judged; cleared when the count of steps starts again."""

    def __init__(self) -> None:
        self.clear()
        self.classes: int | None = None
        """The width of the model's class scores (the output probe); None: not measured, or a
        continuous output."""
        self.sizes: np.ndarray | None = None
        """Each watched parameter's number of elements, from the weight probe's statistics."""

    def clear(self) -> None:
        self.steps = 0
        self.zero_lr = 0
        """Steps at which every group's LR was 0."""
        self.top_lr = 0.0
        self.last_lr: float | None = None
        """The LR of the last step judged."""
        self.fallen = 0
        """Steps judged whose LR was at most `LR_FELL` of the highest before them."""
        self.with_grad = 0
        """Steps with any gradient (a finite norm above 0)."""
        self.got_grad: np.ndarray | None = None
        """Per parameter: whether it got a gradient at any step."""
        self.updates: deque[np.ndarray] = deque(maxlen=SAMPLES)
        """Per sampled step: each parameter's update ratio."""
        self.pin: float | None = None
        """The gradient norm of the steps in a row that read it (within `PIN_TOLERANCE`)."""
        self.pinned = 0
        """Those steps: since a step that read another norm."""

    def see(self, signals: StepSignals, lr: float | None) -> None:
        """Take one step judged."""
        self.steps += 1
        if lr is not None and math.isfinite(lr):
            self.zero_lr += lr == 0
            self.fallen += 0 <= lr <= LR_FELL * self.top_lr
            self.top_lr = max(self.top_lr, lr)
            self.last_lr = lr
        grad = signals.grad_norm
        self.with_grad += bool(math.isfinite(grad) and grad > 0)
        pin = self.pin
        if pin is not None and abs(grad - pin) <= PIN_TOLERANCE * pin:  # NaN: not pinned
            self.pinned += 1
        else:
            self.pin = grad if math.isfinite(grad) and grad > 0 else None
            self.pinned = int(self.pin is not None)
        norms = np.asarray(signals.param_grad_norm, dtype=np.float64)
        got = np.isfinite(norms) & (norms > 0)
        if self.got_grad is None or self.got_grad.shape != got.shape:
            self.got_grad = got  # parameters added: their record starts here
        else:
            self.got_grad |= got
        for sample in signals.sampled:
            ratios = sample.per_param.get(SIGNAL)
            if ratios is not None and len(ratios) == len(norms):
                self.updates.append(np.asarray(ratios, dtype=np.float64))
            sizes = elements(sample.per_param)
            if sizes is not None and len(sizes) == len(norms):
                self.sizes = sizes
            classes = sample.output.get("out_classes")
            if classes is not None and math.isfinite(classes) and classes >= 2:
                self.classes = int(classes)

    def typical_update(self) -> float | None:
        """The median, over the parameters that got a gradient, of each one's median update
        ratio over the sampled steps (a weight that was all zeros, whose ratio is exactly 1,
        left out); None when none was measured."""
        if not self.updates or self.got_grad is None:
            return None
        stacked = np.stack(self.updates)
        stacked = np.where(stacked == FROM_ZERO, np.nan, stacked)
        chosen = stacked[:, self.got_grad]
        if not np.isfinite(chosen).any():
            return None
        per_param = [float(np.median(c[np.isfinite(c)])) for c in chosen.T
                     if np.isfinite(c).any()]
        return float(np.median(per_param))

    def explain(self, recent: list[float], names: list[str], group_lrs: tuple[float, ...],
                trend: float, decay: float | None = None) -> StallReason:
        """The reason the run shows, from the steps judged. `recent`: the last losses (their
        median is the level); `trend`: the Kendall z of the losses judged; `decay`: the share
        of every weight a step that a weight decay the preflight found too strong takes."""
        steps = self.steps
        flowing = 2 * self.with_grad >= steps  # a gradient on most steps, not one now and then
        if self.with_grad == 0:
            return StallReason("no_gradients", "no watched parameter got a gradient in those "
                               "steps (every gradient None or zero): nothing reaches the "
                               "weights", {"gradients": False})
        if steps and self.zero_lr == steps:
            return StallReason("lr_too_low", f"the LR was 0 at every one of those {steps} "
                               "steps, in every parameter group: the optimizer did not move "
                               "the weights", {"lr": 0.0})
        typical = self.typical_update()
        lr = self.top_lr
        zero_groups = sum(1 for g in group_lrs if g == 0)
        if typical == 0.0 and zero_groups:
            return StallReason("lr_too_low", f"the parameters that get gradients took no update "
                               f"at any of the {len(self.updates)} steps measured (||dW|| = 0), "
                               f"and {zero_groups} of the {len(group_lrs)} parameter groups are "
                               "at LR 0: the LR of their groups", {"lr": lr, "update": 0.0})
        last = self.last_lr
        if last is not None and 0 <= last <= LR_FELL * lr and 2 * self.fallen >= steps:
            return StallReason("lr_too_low", f"the LR fell to {last:.3g} by the last of those "
                               f"steps, {lr / last:.3g}x below the {lr:.3g} it had among "
                               "them: a schedule that decays per batch where it was written "
                               "per epoch (StepLR, ExponentialLR stepped in the batch loop), or "
                               "one far shorter than the run, leaves the weights nothing to "
                               "move with", {"lr": last, "highest": lr, "update": typical})
        settings = self._clip_reason(typical, lr, trend) or self._decay_reason(typical, lr, decay)
        if settings is not None:
            return settings
        if typical is not None and typical * steps < MOVED:
            return StallReason("lr_too_low", f"the updates moved the typical weight by "
                               f"{typical:.2g} of its norm per step (median of {len(self.updates)} "
                               f"steps measured), at most {typical * steps:.2g} in {steps} "
                               f"steps: at LR {lr:.3g} the weights barely move",
                               {"lr": lr, "update": typical})
        trained = self._trained_share()
        if trained is not None and trained < TRAINED_SHARE and self.got_grad is not None:
            idle = [n for n, got in zip(names, self.got_grad, strict=False) if not got]
            shown = ", ".join(idle[:NAMED]) + (f" and {len(idle) - NAMED} more"
                                                if len(idle) > NAMED else "")
            return StallReason("no_gradients", f"the parameters that got a gradient hold only "
                               f"{100 * trained:.2g}% of the watched weights: {len(idle)} of the "
                               f"{len(self.got_grad)} watched parameters got none in those steps "
                               f"(frozen, or not reached by the loss): {shown}",
                               {"trained_share": trained, "update": typical})
        level = statistics.median(recent)
        chance = chance_loss(self.classes) if self.classes else None
        at_chance = chance is not None and abs(level - chance) <= CHANCE_TOLERANCE * chance
        if at_chance and typical is not None and trend > -TREND_Z and flowing:
            return StallReason("label_problem", f"the loss sits at chance level, ln {self.classes}"
                               f" = {chance:.4g} for the model's {self.classes} class scores, "
                               f"while the weights move ({typical:.2g} of their norm per step) "
                               f"and the gradients flow: the model does no better than a "
                               "uniform guess, what it is left with when the labels carry no "
                               "signal of the inputs (labels drawn apart from them, or shuffled "
                               "away from them)",
                               {"chance": chance, "classes": self.classes, "update": typical})
        steady = self._steady_reason(typical, lr, trend) if flowing else None
        if steady is not None:
            return steady
        seen = []
        if trend <= -TREND_Z:
            seen.append("the loss falls steadily, but slowly")
        if typical is not None:
            seen.append(f"the weights move ({typical:.2g} of their norm per step)")
        seen.append("the gradients flow" if flowing else
                    f"a gradient came on {self.with_grad} of those {steps} steps")
        if chance is not None and not at_chance:
            seen.append(f"the loss is {'below' if level < chance else 'above'} chance level "
                        f"(ln {self.classes} = {chance:.4g})")
        facts = f"{', '.join(seen[:-1])} and {seen[-1]}" if len(seen) > 1 else seen[0]
        return StallReason(None, f"{facts}; no cause shows (the LR may be too high or too low "
                           "for this model)", {"update": typical})

    def _steady_reason(self, typical: float | None, lr: float, trend: float
                       ) -> StallReason | None:
        """`lr_too_low` when the loss falls steadily under updates below `STEADY_STEP`."""
        if not (trend <= -TREND_Z and typical is not None and typical < STEADY_STEP):
            return None
        return StallReason("lr_too_low", f"the loss falls steadily, but slowly (its trend "
                           f"{-trend:.1f} standard errors below none over those {self.steps} "
                           f"steps), and the updates move the typical weight by {typical:.2g} "
                           f"of its norm per step (median of {len(self.updates)} steps "
                           f"measured): each step helps, and at LR {lr:.3g} the steps are "
                           "small for what is left to learn (an LR too high throws the loss "
                           "around instead)", {"lr": lr, "update": typical})

    def _clip_reason(self, typical: float | None, lr: float, trend: float) -> StallReason | None:
        """`clip_too_tight` when the loop's clip pinned the norm and the updates are small."""
        pin, steps = self.pin, self.steps
        if not (pin is not None and steps and self.pinned >= PINNED_SHARE * steps
                and typical is not None and (typical * steps < SLOW or trend <= -TREND_Z)):
            return None
        return StallReason("clip_too_tight", f"the gradient norm was {pin:.3g} at "
                           f"{self.pinned} of those {steps} steps in a row (within "
                           f"{PIN_TOLERANCE:.1%}), the norm a clip_grad_norm_ in the loop leaves "
                           f"when its max_norm is under every step's norm: each update is scaled "
                           f"to it whatever the loss asks, and the updates moved the typical "
                           f"weight by {typical:.2g} of its norm per step (median of "
                           f"{len(self.updates)} steps measured)",
                           {"grad_norm": pin, "lr": lr, "update": typical})

    def _decay_reason(self, typical: float | None, lr: float,
                      decay: float | None) -> StallReason | None:
        """`weight_decay_too_high` when the weights moved at most `DECAY_SHARE` times what the
        decay alone takes."""
        if decay is None or typical is None or typical > DECAY_SHARE * decay:
            return None
        return StallReason("weight_decay_too_high", f"the weight decay takes {decay:.2%} of "
                           f"every weight's norm a step on its own, and the weights moved "
                           f"{typical:.2g} of their norm per step (median of {len(self.updates)} "
                           "steps measured): the updates are mostly the decay's, which holds "
                           "the weights small whatever the loss asks",
                           {"decay_per_step": decay, "lr": lr, "update": typical})

    def _trained_share(self) -> float | None:
        """The share of the watched weights (by elements, or by parameters when their sizes
        were not measured) held by the parameters that got a gradient."""
        if self.got_grad is None or not len(self.got_grad):
            return None
        sizes = self.sizes if self.sizes is not None else np.ones(len(self.got_grad))
        sizes = np.nan_to_num(np.asarray(sizes, dtype=np.float64), nan=0.0, posinf=0.0)
        total = float(sizes.sum())
        return float(sizes[self.got_grad].sum()) / total if total > 0 else None

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "zero_lr": self.zero_lr, "top_lr": self.top_lr,
                "last_lr": self.last_lr, "fallen": self.fallen, "with_grad": self.with_grad,
                "got_grad": None if self.got_grad is None else self.got_grad.tolist(),
                "updates": [u.tolist() for u in self.updates], "classes": self.classes,
                "sizes": None if self.sizes is None else self.sizes.tolist(),
                "pin": self.pin, "pinned": self.pinned}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.clear()
        self.steps = int(state.get("steps", 0))
        self.zero_lr = int(state.get("zero_lr", 0))
        self.top_lr = float(state.get("top_lr", 0.0))
        last = state.get("last_lr")
        self.last_lr = None if last is None else float(last)
        self.fallen = int(state.get("fallen", 0))
        self.with_grad = int(state.get("with_grad", 0))
        got = state.get("got_grad")
        self.got_grad = None if got is None else np.asarray(got, dtype=bool)
        self.updates = deque((np.asarray(u, dtype=np.float64) for u in state.get("updates", [])),
                             maxlen=SAMPLES)
        classes = state.get("classes")
        self.classes = None if classes is None else int(classes)
        sizes = state.get("sizes")
        self.sizes = None if sizes is None else np.asarray(sizes, dtype=np.float64)
        pin = state.get("pin")
        self.pin = None if pin is None else float(pin)
        self.pinned = int(state.get("pinned", 0))
