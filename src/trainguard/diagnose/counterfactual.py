"""Counterfactual replay: a cause is proved when changing only that one thing heals the bad step.

From the state before a bad update (the model, the optimizer, the RNG, the batch), `prove` replays
the step once as it happened and once per intervention, each changing one thing:

    lr_x0.1, x0.01  the learning rate x0.1 (then x0.01)             lr_too_high
    warmup          the LR a warm-up ramp gives at this step        missing_warmup
    bf16 / fp32     bf16 for a float16 run, fp32 for float16        fp16_overflow, numerical_op
                    weights                                         (optimizer_eps)
    float64         the forward and the loss in float64             numerical_op
    safe_ops        log(x) as log(max(x, tiny)), x / 0 as x / 1     numerical_op
    drop_flagged    the batch without its non-finite or outlying    outlier_batch,
                    samples                                         nonfinite_input,
                                                                    input_scale,
                                                                    tokenizer_mismatch
    previous_batch  the last good batch in place of this one        the data: every data cause
                                                                    this batch can hold
                                                                    (empty_loss, label_problem
                                                                    too)
    lora_scaling    every LoRA scaling (alpha/r) set to 2           lora_scaling
    head_init       the over-scaled new layer re-drawn at std 0.02  bad_init
    clip            gradients clipped at the run's typical norm     (a one-step explosion)

A replay takes the update(s) on the batch and measures the loss before them, the gradient norm and
the loss on the same batch after them, with the same dropout masks (the RNG is put back before
every forward). A replay is bad when something is non-finite, when the loss or the gradient norm is
far above the run's typical values (`Baseline`), or when the update raised the loss of its own
batch. An intervention that heals a bad plain replay **confirms** the causes it tests that the
votes name: it is judged against the plain replay in what that replay is bad in, and heals only by
moving that value (a loss, a gradient norm) by more than `SAME_LOSS` of it (a value left about
where it was is the same outcome, whichever side of a threshold it falls). One that does not heal
**rules them out**, where it can tell: a change of the update says nothing about a step already bad
before its update (the damage is older: those fixes are not tried, and the proof names them with
what would give a state from before the damage, `Setup.earlier`), float64 keeping a NaN clears no
unsafe operation (log(0) is NaN at any precision), and the same crash as the plain replay's says
nothing. A healed batch proves the data, not which of its faults: the previous good batch confirms
every data cause the batch can hold (outlier, scale, labels, tokenizer, NaN), and the votes order
them; it confirms nothing when the model no longer learns from that good batch (the state is
broken) or when a fix that keeps the batch heals the step too (the batch only tripped that fix's
cause, an unsafe operation say). A plain replay that is not bad (or is finite where the step was
not) makes the fault **not reproducible**: a transient or hardware fault, or trouble that began
earlier. When the replay's loss is the loss the step had when it ran (and it ran finite), the step
was replayed faithfully and is simply not bad on its own: the trouble built up over earlier steps
(a divergence), which a window replay from a good state can prove, and no transient is suggested.
When its loss is far from that recorded loss (beyond `SAME_LOSS`), the replay does not compute what
the run did (the run scaled or reduced its loss outside the loss function the replay calls): the
trouble lies outside the replay (`Proof.replay_differs`), and no fix is tried or confirmed from it.

The proof of a warning before any bad step (a precursor, a blown-up start: `Setup.warned`) is a
window replay judged on the warned signal as well (`diagnose/warned_signal.py`): the bad step is
bad while the signal is at or above the warning's bound; its fixes are the LR ones, a warm-up
ramp over the window and the model edits (LoRA scaling, a re-drawn layer), and the first that
heals, by the votes, is the one confirmed (over a window a lower LR calms any growth, so the
likeliest fix that does is what it shows).

Interventions run likeliest first (by the current votes) within a time budget. The model, the
optimizer (its state and hyperparameters), the gradients, the training mode and the RNG are put
back exactly afterwards: the run goes on as it would have. Nothing here runs on healthy steps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from trainguard.diagnose.batch import IGNORE_INDEX, named_tensors
from trainguard.diagnose.preflight import HF_INIT_STD, INIT_SCALE_LIMIT
from trainguard.diagnose.replay import LossFn
from trainguard.diagnose.warned_signal import LOSS, WarnedSignal
from trainguard.rng import TorchRNG, process_state, put_process_state, put_torch_state

LOSS_SPIKE = 3.0
"""A replayed loss this many times the run's typical loss is bad."""
GRAD_SPIKE = 10.0
"""A gradient norm this many times the run's typical norm is bad (the adaptive clip's alarm is
the same order)."""
WINDOW_LAST = 5
WINDOW_SPIKE = 1.5
"""A window replay is judged on the median loss of its last `WINDOW_LAST` steps, bad above this
many times the run's typical loss: the recover policy's "back near its level" (its
`settle_ratio`), the test a divergence that built up over the window failed."""
SAME_LOSS = 0.25
"""A replayed loss within this share of the one the run recorded for the same step and state is
the same loss (the dropout masks differ where the step's RNG was not kept; a loss function
unlike the run's, summed or scaled, is further off): the replay reproduces the run's losses, so
the recorded ones can stand for a window replayed as it happened, if bad by a margin this share
leaves no doubt about (`record_stands`). A replayed loss further off than this does not compute
what the run did (`_differs`), and a fix that moves the plain replay's bad value by no more than
this share left it as it was (`_moved`)."""
RISE = 0.25
"""An update that raises its own batch's loss by more than this share is bad: a healthy step
lowers the loss of the batch it was computed on."""
LR_FACTORS = (0.1, 0.01)
"""LR x0.1, then x0.01 (an LR 100x too high is still 10x too high at x0.1): `lr_too_high` is
confirmed by the first that heals, ruled out only when neither does."""
WARMUP_STEPS = 20
"""The warm-up ramp replayed in place of the schedule: step s of the run at (s + 1) / 20 of its
LR (the cause ranking's early steps). Later steps have no warm-up to miss."""
LORA_SCALING = 2.0
INIT_STD = HF_INIT_STD
FLAGGED_RATIO = 50.0
"""A sample whose largest |x| is this many times the batch's median sample is flagged (as the
batch inspector's outlier ratio)."""
BATCH_CAUSES = ("outlier_batch", "nonfinite_input", "input_scale", "tokenizer_mismatch")
DATA_CAUSES = (*BATCH_CAUSES, "label_problem", "empty_loss")
"""What a healed batch proves: the data is at fault, which of these the votes say."""
ONE_BATCH = "outlier_batch"
"""The one data cause a batch that does not heal rules out (the others may be in the previous
batch as well: a shifted scale, wrong labels, a wrong tokenizer for a whole shard)."""
VANISHED = 1e-3
"""A gradient norm below this share of the run's typical norm on the previous good batch: the
model no longer learns from a batch that trained it a step ago, so the state, not the batch, is
broken (saturated or dead units)."""
FLAG_CAUSES = {"nonfinite": ("nonfinite_input",), "outlier": ("outlier_batch", "input_scale"),
               "token_id": ("tokenizer_mismatch",)}
"""Why a sample was flagged -> the causes leaving it out tests."""
PRECISION_CAUSES = ("fp16_overflow", "numerical_op")
FORWARD, UPDATE = "forward", "update"
BY_LOSS, BY_GRAD_NORM, BY_SIGNAL, BY_RISE = "loss", "grad_norm", "signal", "rise"
"""What a replay is bad in: its loss (or a crash), its gradient norm, the warned signal, the rise
of its batch's loss over its update. A fix is judged in the measure the plain replay is bad in."""
TESTED_CAUSES = frozenset({"lr_too_high", "missing_warmup", *PRECISION_CAUSES, *DATA_CAUSES,
                           "lora_scaling", "bad_init", "optimizer_eps"})
"""The causes some intervention can confirm."""


@dataclass(frozen=True, slots=True)
class Baseline:
    """The run's typical loss and gradient norm (medians of its healthy steps); None: unknown."""

    loss: float | None = None
    grad_norm: float | None = None
    signal_bound: float | None = None
    """The proof of a warning before any bad step: at or above this the warned signal is high
    (`diagnose/warned_signal.py`); None: no signal is judged."""
    signal_what: str = ""
    """What the signal is, in words."""

    @classmethod
    def of(cls, losses: Sequence[float], norms: Sequence[float]) -> Baseline:
        def median(values: Sequence[float]) -> float | None:
            finite = sorted(v for v in values if math.isfinite(v))
            return finite[len(finite) // 2] if finite else None
        return cls(median(losses), median(norms))


@dataclass
class Outcome:
    """One replay: the loss before the update(s), the gradient norm, the loss after."""

    name: str
    label: str
    loss: float
    grad_norm: float
    after: float
    seconds: float = 0.0
    error: str | None = None
    window: int = 0
    """Steps replayed before this one (a window replay): `loss` is then the median loss of the
    last `WINDOW_LAST` steps."""
    recorded: bool = False
    """Not replayed: the losses and the gradient norm the run recorded as the steps happened
    (`after` is then unknown: NaN)."""
    signal: float | None = None
    """The proof of a warning before any bad step: the warned signal on the bad step (NaN: not
    measured)."""

    @property
    def finite(self) -> bool:
        return self.error is None and all(math.isfinite(v) for v in
                                          (self.loss, self.grad_norm, self.after))

    def forward_bad(self, base: Baseline) -> str:
        """Why the step itself (loss, gradients) is bad; "" when it is not."""
        return self._forward_fault(base)[1]

    def forward_measure(self, base: Baseline) -> str:
        """The measure the step itself is bad in (`BY_LOSS`, `BY_GRAD_NORM`, `BY_SIGNAL`); ""
        when it is not bad."""
        return self._forward_fault(base)[0]

    def _forward_fault(self, base: Baseline) -> tuple[str, str]:
        if self.error is not None:
            return BY_LOSS, f"the step raised {self.error}"
        if not math.isfinite(self.loss):
            return BY_LOSS, f"the step's loss is {_num(self.loss)}"
        if not math.isfinite(self.grad_norm):
            return BY_GRAD_NORM, f"the gradient norm is {_num(self.grad_norm)}"
        signal, bound = self.signal, base.signal_bound
        if signal is not None and bound is not None and signal >= bound:
            return BY_SIGNAL, (f"{base.signal_what} is {_num(signal)} (the warning's bound "
                               f"{_num(bound)})")
        spike = WINDOW_SPIKE if self.window else LOSS_SPIKE
        if base.loss is not None and self.loss > spike * max(base.loss, 1e-8):
            return BY_LOSS, (f"{self.what()} is {_num(self.loss)} (run's typical "
                             f"{_num(base.loss)})")
        if base.grad_norm is not None and self.grad_norm > GRAD_SPIKE * max(base.grad_norm, 1e-12):
            return BY_GRAD_NORM, (f"the gradient norm is {_num(self.grad_norm)} (run's "
                                  f"typical {_num(base.grad_norm)})")
        return "", ""

    def value(self, measure: str) -> float:
        """The outcome's value in `measure` (NaN: not measured); the rise of the batch's loss
        over the update for `BY_RISE`."""
        if measure == BY_SIGNAL:
            return math.nan if self.signal is None else self.signal
        if measure == BY_GRAD_NORM:
            return self.grad_norm
        if measure == BY_RISE:
            return self.after - self.loss
        return self.loss

    def signal_high(self, base: Baseline) -> bool:
        """The warned signal measured at or above its bound (never when unmeasured)."""
        return (base.signal_bound is not None and self.signal is not None
                and self.signal >= base.signal_bound)

    def what(self) -> str:
        """What `loss` is."""
        if self.window:
            return f"the median loss of the last {min(WINDOW_LAST, self.window + 1)} steps"
        return "the step's loss"

    def update_bad(self) -> str:
        """Why the update is bad (it broke or raised its own batch's loss); "" when it is not."""
        if not math.isfinite(self.after):
            return f"the loss after the update is {_num(self.after)}"
        if math.isfinite(self.loss) and self.after > self.loss + RISE * abs(self.loss):
            return (f"the update raised the batch's loss from {_num(self.loss)} to "
                    f"{_num(self.after)}")
        return ""

    def bad(self, base: Baseline) -> str:
        return self.forward_bad(base) or self.update_bad()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "label": self.label, "loss": self.loss,
                "grad_norm": self.grad_norm, "after": self.after, "seconds": self.seconds,
                "error": self.error, "signal": self.signal}


@dataclass
class Change:
    """What one replay changes (nothing, for the plain replay)."""

    lr_factors: tuple[float, ...] = (1.0,)
    batch: Any = None
    edit: Callable[[nn.Module], None] | None = None
    """Changes the model after the state is restored (the restore undoes it)."""
    dtype: torch.dtype | None = None
    """Run the forward in this dtype (the model's floats and the batch's cast, autocast off)."""
    autocast: torch.dtype | None = None
    clip: float | None = None
    safe_ops: bool = False
    """Run the forward with its unsafe operations guarded (`_SafeOps`)."""
    window_batches: tuple[Any, ...] | None = None
    """A window replay: the batch each step of the window trains on instead of its own."""
    window_factors: tuple[float, ...] | None = None
    """A window replay: the LR factor of each step of the window (a warm-up ramp); None: the
    first of `lr_factors` on every step."""


@dataclass(frozen=True, slots=True)
class Intervention:
    name: str
    label: str
    """Says what was changed: "with LR x0.1", "in bf16"..."""
    causes: tuple[str, ...]
    aspect: str
    """FORWARD: heals only if the whole replay is healthy; UPDATE: changes only the update, so
    it heals (or fails to heal) only a bad update of a step whose loss and gradients were
    finite: with the step itself already bad, the state was damaged before it, and the update
    intervention says nothing."""
    change: Change
    rules_out: tuple[str, ...] | None = None
    """The causes it rules out when it does not heal (None: all of `causes`). A NaN that float64
    does not heal may still be an unsafe operation (log(0) is NaN at any precision)."""
    data: bool = False
    """It swaps the whole batch: a heal proves the data, so it confirms every cause in `causes`
    (the votes order them), and only if the replay still learns (`VANISHED`) and the good data
    gives about the run's typical loss (at most `WINDOW_SPIKE` x: else the state diverged)."""


@dataclass(frozen=True, slots=True)
class WindowStep:
    """One step between a good state and the bad step, as it happened: its batch, the LR of
    each parameter group, whether its update was applied (a skipped step only ran its forward
    and backward), and the loss the run recorded (None: not known)."""

    step: int
    batch: Any
    lrs: tuple[float, ...]
    applied: bool = True
    loss: float | None = None
    forward_rng: TorchRNG | None = None
    """The RNG state its forward started from (None: not kept; the RNG runs on)."""


@dataclass
class Setup:
    """What a proof needs: the state before the bad update, the loss and what the run knows."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: LossFn
    batch: Any
    step: int = 0
    previous_batch: Any = None
    autocast: torch.dtype | None = None
    """The dtype the run's forward runs under (float16 with a GradScaler), None for none."""
    baseline: Baseline = field(default_factory=Baseline)
    original_finite: bool | None = None
    """Whether the step's loss and gradients were finite when it ran (None: unknown)."""
    original_loss: float | None = None
    """The step's loss when it ran (None: unknown, or a replay from another state)."""
    forward_rng: TorchRNG | None = None
    """The RNG state the step's forward started from (`diagnose/step_rng.py`): every replayed
    forward of the step starts from it, drawing the step's own dropout masks (None: the RNG as
    it stands when the proof begins, the same masks for every replay)."""
    init_suspects: tuple[str, ...] = ()
    """Weights the preflight found far above their usual initial scale."""
    no_warmup: bool | None = None
    """The schedule has no warm-up (the preflight's finding); False: it has one, so no warm-up
    ramp is replayed; None: unknown."""
    batch_causes: tuple[str, ...] = ()
    """The causes the batch inspector named for this step's batch."""
    incident: bool = True
    """The step raised an error (False: a proof on demand, of a step that may be healthy)."""
    origin: str = ""
    """Where the replay starts when not from the state before the step's own update."""
    state_step: int | None = None
    """The step the replayed state is from, when not `step` (a good state): the warm-up ramp's
    step."""
    window: tuple[WindowStep, ...] = ()
    """The steps from the replayed state up to the bad one, replayed first, as they happened (a
    window replay): the LR interventions apply to every step of it, with the good data (or, for
    a warning before any bad step, the warm-up ramp and the model edits)."""
    recorded: Outcome | None = None
    """A window replay: the window as the run recorded it (`recorded_window`), standing for the
    plain replay when the window's first step replays to the loss the run recorded for it."""
    update_seconds: float | None = None
    """The time of one replayed update, when the plain replay (which times it) is not run."""
    rules_out: bool = True
    """False: an intervention that does not heal rules nothing out (a window from a state
    already inside the trouble: the damage may be older)."""
    warned: WarnedSignal | None = None
    """The proof of a warning before any bad step: the signal measured on the bad step's
    forward and backward (the step is bad while it is high: `Baseline.signal_bound`); the first
    intervention, by the votes, that keeps it under the bound is the one confirmed."""
    damage_loss: float | None = None
    """A window replay: the loss of the model as the window left it (the run's state at the bad
    step) on the window's first batch, data from before the trouble (None: not measured). Near
    the run's typical loss, the model is not damaged: a lower LR that heals the window only
    learned less from the window's data, which proves nothing of the LR."""
    earlier: str = ""
    """What would give the proof a state from before the damage, said when the fixes of the
    update cannot be tried from this one (the step is bad before its update); "": the general
    advice (`EARLIER`)."""


EARLIER = "a replay from a good state from before the damage"
"""What lets the fixes of the update be tried when the replayed state is already damaged."""


@dataclass
class Proof:
    step: int
    plain: Outcome
    baseline: Baseline
    reproduced: bool
    why_bad: str
    incident: bool = True
    origin: str = ""
    window: int = 0
    """Steps replayed before the bad one (a window replay)."""
    faithful: bool | None = None
    """Whether the plain replay's loss is the loss the step had when it ran (within
    `FAITHFUL_TOLERANCE`); None: unknown. A step that replays as it ran but is not bad on its
    own is reproduced faithfully: its damage is older, not a transient fault."""
    trials: list[tuple[Intervention, Outcome, bool | None]] = field(default_factory=list)
    confirmed: dict[str, str] = field(default_factory=dict)
    """Cause code -> the sentence that proves it."""
    confirmed_by: dict[str, str] = field(default_factory=dict)
    """Cause code -> the intervention that confirmed it (the data causes share one)."""
    ruled_out: dict[str, str] = field(default_factory=dict)
    not_tried: list[str] = field(default_factory=list)
    untested: set[str] = field(default_factory=set)
    """The causes of the interventions left out: none of them is ruled out (LR x0.01 may heal
    what x0.1 did not)."""
    """Interventions left out for lack of time."""
    seconds: float = 0.0
    damage_loss: float | None = None
    """`Setup.damage_loss` (a window replay's)."""
    undamaged: bool = False
    """The window's model does well on data from before the trouble: a lower LR's heal did not
    count (`_undamaged`)."""
    of_error: bool = True
    """The proved step raised an error (or halted, or rolled back); False: a warning's jump."""
    warned: str = ""
    """The proof of a warning before any bad step: the signal it measured (`WarnedSignal.what`)."""
    recorded_loss: float | None = None
    """The loss the step had when it ran (`Setup.original_loss`)."""
    replay_differs: bool = False
    """The plain replay does not reproduce the step as the run recorded it: from the same state
    and batch it gives another loss (beyond `SAME_LOSS`) and is not bad. What the run recorded
    is not what the replay computes (the loop scales or reduces its loss outside the loss
    function the replay calls), so the trouble lies outside the replay, and nothing is
    confirmed from it."""
    cannot_try: list[str] = field(default_factory=list)
    """Fixes of the update not tried because the step is bad before its update: from this state
    a changed update cannot heal it (`Setup.earlier` says what would let them be tried)."""
    cannot_try_causes: list[str] = field(default_factory=list)
    """The causes those fixes test."""
    earlier: str = ""
    """`Setup.earlier`."""

    def summary(self) -> str:
        text = self._summary()
        return f"{self.origin}: {text}" if self.origin else text

    def _summary(self) -> str:
        if not self.reproduced and not self.incident:
            return (f"nothing to heal: the replay of step {self.step} is healthy (the step's "
                    f"loss is {_num(self.plain.loss)}, after its update {_num(self.plain.after)})")
        bound = self.baseline.signal_bound
        if not self.reproduced and self.warned and bound is not None:
            seen = self.plain.signal
            return (f"the warning is not reproduced: the replay kept {self.warned} at "
                    f"{'an unmeasured value' if seen is None or math.isnan(seen) else _num(seen)}"
                    f", under the warning's bound {_num(bound)}")
        if not self.reproduced and self.replay_differs and self.recorded_loss is not None:
            return (f"the replay does not reproduce step {self.step} as it ran: the run recorded "
                    f"its loss as {_num(self.recorded_loss)}, the replay of the same state and "
                    f"batch gives {_num(self.plain.loss)} (after its update "
                    f"{_num(self.plain.after)}): the trouble lies outside what the replay "
                    "computes (the loss the run recorded is not the replay's loss function: a "
                    "scale or a reduction applied outside it, say), so no fix is confirmed from "
                    "it")
        if not self.reproduced and self.faithful:
            return (f"step {self.step} replays as it ran (its loss {_num(self.plain.loss)}, as "
                    f"recorded) but is not bad on its own (after its update "
                    f"{_num(self.plain.after)}): the trouble built up over earlier steps, which "
                    "one step cannot prove (a window replay from a good state can)")
        if not self.reproduced:
            return (f"not reproducible: the replay of step {self.step} is healthy (the step's "
                    f"loss is {_num(self.plain.loss)}, after its update {_num(self.plain.after)}):"
                    " a transient or hardware fault, or trouble that began before this step")
        parts = [f"{code}: {why}" for code, why in self.confirmed.items()]
        parts += [f"{code}: {why}" for code, why in self.ruled_out.items()]
        if not parts and self.trials:
            parts = [f"step {self.step} is bad ({self.why_bad}); no fix tried healed it or "
                     f"ruled a likely cause out ({', '.join(i.name for i, _, _ in self.trials)})"]
        elif not parts and self.cannot_try:  # said below, with why
            parts = [f"step {self.step} is bad ({self.why_bad})"]
        elif not parts:
            parts = [f"no fix applies to step {self.step} ({self.why_bad})"]
        if self.not_tried:
            parts.append(f"not tried for lack of time: {', '.join(self.not_tried)}")
        if self.cannot_try:
            tests = (f" (testing {', '.join(self.cannot_try_causes)})"
                     if self.cannot_try_causes else "")
            parts.append(f"could not try {', '.join(self.cannot_try)}{tests} from this state: "
                         f"step {self.step} is bad before its update, so its damage is older "
                         "than the state and a changed update cannot undo it; "
                         f"{self.earlier or EARLIER} would let them be tried")
        if self.undamaged and self.damage_loss is not None and self.baseline.loss is not None:
            parts.append(f"a lower LR heals the window, but the model it left does well on data "
                         f"from before the trouble (loss {_num(self.damage_loss)}, run's "
                         f"typical {_num(self.baseline.loss)}): it is not damaged, so the "
                         "window's data, not its LR, may be at fault")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "reproduced": self.reproduced, "faithful": self.faithful,
                "why_bad": self.why_bad,
                "incident": self.incident, "origin": self.origin, "window": self.window,
                "confirmed": dict(self.confirmed), "confirmed_by": dict(self.confirmed_by),
                "ruled_out": dict(self.ruled_out), "not_tried": list(self.not_tried),
                "cannot_try": list(self.cannot_try), "replay_differs": self.replay_differs,
                "recorded_loss": self.recorded_loss,
                "seconds": self.seconds, "damage_loss": self.damage_loss,
                "undamaged": self.undamaged, "warned": self.warned,
                "plain": self.plain.to_dict(),
                "baseline": {"loss": self.baseline.loss, "grad_norm": self.baseline.grad_norm,
                             "signal_bound": self.baseline.signal_bound},
                "trials": [{**o.to_dict(), "causes": list(i.causes), "healed": healed}
                           for i, o, healed in self.trials]}


def _num(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.3g}"


# -- the state a proof puts back ---------------------------------------------------------------


class ReplayState:
    """What a replay changes and must leave as it found it, taken in place: not the good-state
    ring's `recovery.state.SavedState` (state dicts a rollback loads, with the run's own state
    and a finite flag), but live copies put back into the same tensors, with the gradients,
    training modes and adapter scalings a replay overwrites.

    The model's parameters and buffers, the optimizer's state and hyperparameters, the
    gradients, the training mode and every RNG, copied once; `restore` puts them back in place
    (the same tensor objects, so nothing holding a reference sees a difference)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        with torch.no_grad():
            self.params = [(p, p.detach().clone()) for p in model.parameters()]
            self.buffers = [(m, name, b.detach().clone()) for m in model.modules()
                            for name, b in m._buffers.items() if b is not None]
            self.grads = [(p, p.grad) for p, _ in self.params]
            self.opt_state = {p: {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v)
                                  for k, v in s.items()} for p, s in optimizer.state.items()}
        self.groups = [{k: v for k, v in g.items() if k != "params"}
                       for g in optimizer.param_groups]
        self.training = [(m, m.training) for m in model.modules()]
        self.scalings: list[tuple[dict[Any, Any], dict[Any, Any]]] = [
            (scaling, dict(scaling)) for m in model.modules()
            if isinstance(scaling := getattr(m, "scaling", None), dict)]
        self.process_rng = process_state()
        self.step_rng: TorchRNG | None = None
        """Where every replayed forward starts (`Setup.forward_rng`); None: the RNG as saved."""

    def rng(self) -> None:
        """Before a replayed forward: every RNG at the step's start (the same dropout masks for
        every forward, the step's own when they were kept)."""
        self._put_back()
        if self.step_rng is not None:
            put_torch_state(self.step_rng)

    def _put_back(self) -> None:
        put_process_state(self.process_rng)

    def restore(self) -> None:
        with torch.no_grad():
            for p, saved in self.params:
                if p.dtype != saved.dtype or p.shape != saved.shape:
                    p.data = saved.clone()
                else:
                    p.copy_(saved)
            for module, name, saved in self.buffers:
                current = module._buffers.get(name)
                if current is None or current.dtype != saved.dtype:
                    module._buffers[name] = saved.clone()
                else:
                    current.copy_(saved)
            self._restore_optimizer()
        for p, grad in self.grads:
            p.grad = grad
        for module, training in self.training:
            module.training = training
        for live, scaling in self.scalings:
            live.update(scaling)
        self._put_back()

    def _restore_optimizer(self) -> None:
        state = self.optimizer.state
        for p in [p for p in state if p not in self.opt_state]:
            del state[p]  # state the replays created where there was none
        for p, saved in self.opt_state.items():
            current = state[p]
            for key in [k for k in current if k not in saved]:
                del current[key]
            for key, value in saved.items():
                old = current.get(key)
                if (isinstance(value, torch.Tensor) and isinstance(old, torch.Tensor)
                        and old.shape == value.shape and old.dtype == value.dtype):
                    old.copy_(value)
                else:
                    current[key] = value.clone() if isinstance(value, torch.Tensor) else value
        for group, saved_group in zip(self.optimizer.param_groups, self.groups, strict=True):
            group.update(saved_group)


# -- one replay --------------------------------------------------------------------------------


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, Mapping):
        cast = {k: _cast(v, dtype) for k, v in value.items()}
        try:
            return type(value)(cast)  # type: ignore[call-arg]
        except Exception:  # a mapping type that cannot be built from a dict
            return cast
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


@contextmanager
def _precision(setup: Setup, change: Change) -> Iterator[Any]:
    """The batch to use, under the change's precision (the model cast in place: the restore
    puts its dtypes back)."""
    batch = change.batch if change.batch is not None else setup.batch
    device = next(setup.model.parameters()).device.type
    if change.dtype is not None:
        for p in setup.model.parameters():
            p.data = p.data.to(change.dtype)
            if p.grad is not None:
                p.grad = None
        for module in setup.model.modules():
            for name, b in module._buffers.items():
                if b is not None and b.is_floating_point():
                    module._buffers[name] = b.to(change.dtype)
        with torch.autocast(device, enabled=False):
            yield _cast(batch, change.dtype)
        return
    dtype = change.autocast
    with (torch.autocast(device, dtype=dtype) if dtype is not None else nullcontext()):
        yield batch


def _grad_norm(model: nn.Module) -> torch.Tensor:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm(g.detach().float()) for g in grads]))


def replay_step(setup: Setup, saved: ReplayState, change: Change, name: str = "as_it_happened",
                label: str = "as it happened") -> Outcome:
    """Restore the state, then take the change's updates on the batch; the losses and the
    gradient norm of the first update, and the loss after the last."""
    started = time.perf_counter()
    saved.restore()
    model, opt = setup.model, setup.optimizer
    if change.edit is not None:
        change.edit(model)
    model.train()
    first: list[torch.Tensor] = []
    after = torch.tensor(math.nan)
    error = None
    signal: float | None = None
    guard: Callable[[], Any] = _SafeOps if change.safe_ops else nullcontext
    try:
        with _precision(setup, change) as batch:
            saved.rng()
            swaps = change.window_batches or (None,) * len(setup.window)
            factors = change.window_factors or (change.lr_factors[0],) * len(setup.window)
            window = [_window_step(setup, past, factor, swap)  # the steps before the bad one
                      for past, swap, factor in zip(setup.window, swaps, factors, strict=True)]
            for factor in change.lr_factors:
                for group, saved_group in zip(opt.param_groups, saved.groups, strict=True):
                    group["lr"] = saved_group["lr"] * factor
                saved.rng()
                opt.zero_grad(set_to_none=True)
                reading = (setup.warned.start(model)
                           if setup.warned is not None and not first else None)
                try:
                    with guard():  # the forward only: the optimizer's divisions are left alone
                        loss = setup.loss_fn(model, batch)
                    loss.backward()
                    if reading is not None:
                        signal = reading.finish(model, opt)
                finally:
                    if reading is not None:
                        reading.close()
                norm = _grad_norm(model)
                if change.clip is not None:
                    torch.nn.utils.clip_grad_norm_(
                        [p for p in model.parameters() if p.grad is not None], change.clip)
                if not first:
                    last = torch.stack([*window, loss.detach().float().reshape(())][-WINDOW_LAST:])
                    first = [last.median(), norm.float()]
                _step(opt, model, change)
            saved.rng()
            with torch.no_grad(), guard():
                after = setup.loss_fn(model, batch).detach().float().reshape(())
    except Exception as exc:  # a crash is an answer too
        error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
    values = torch.stack([*first, after.to(first[0].device)]).tolist() if first else [
        math.nan, math.nan, math.nan]
    if setup.warned is not None and setup.warned.signal == LOSS:
        signal = values[0]  # the loss as a window is judged: the median of its last steps
    elif setup.warned is not None and signal is None:
        signal = math.nan
    return Outcome(name, label, values[0], values[1], values[2],
                   seconds=time.perf_counter() - started, error=error, window=len(setup.window),
                   signal=signal)


def _window_step(setup: Setup, past: WindowStep, factor: float,
                 batch: Any = None) -> torch.Tensor:
    """One step of a window replay (on `batch` in place of its own, when given), its loss: from
    the RNG state the step's forward started from when it was kept (its own dropout masks),
    else the RNG runs on from the state's (the same masks for every replay of the window)."""
    model, opt = setup.model, setup.optimizer
    for group, lr in zip(opt.param_groups, past.lrs, strict=True):
        group["lr"] = lr * factor
    opt.zero_grad(set_to_none=True)
    if past.forward_rng is not None:
        put_torch_state(past.forward_rng)
    loss = setup.loss_fn(model, past.batch if batch is None else batch)
    loss.backward()
    if past.applied:
        opt.step()
    return loss.detach().float().reshape(())


def _step(opt: torch.optim.Optimizer, model: nn.Module, change: Change) -> None:
    """The optimizer step; under a float cast, the optimizer's state follows the parameters."""
    if change.dtype is not None:
        for p in model.parameters():
            state = opt.state.get(p)
            for key, value in (state or {}).items():
                if isinstance(value, torch.Tensor) and value.is_floating_point() \
                        and value.shape == p.shape:
                    state[key] = value.to(p.dtype)  # type: ignore[index]
    opt.step()


# -- the interventions ---------------------------------------------------------------------------


def interventions(setup: Setup) -> list[Intervention]:
    """Every intervention that applies to this run and batch (whatever the votes say); for a
    window replay, the LR ones, applied to every step of the window (so they change the bad
    step's forward too), and the good data, or for a warning before any bad step the warm-up
    ramp over the window and the model edits."""
    if setup.window:
        first = setup.window[0].step
        lrs = [Intervention(f"lr_x{factor:g}", f"with LR x{factor:g} from step {first}",
                            ("lr_too_high",), FORWARD,
                            Change(lr_factors=(factor,), autocast=setup.autocast),
                            rules_out=None if setup.rules_out else ())
               for factor in LR_FACTORS]
        if setup.warned is not None:  # no bad data yet: the model's settings over the window
            return [*lrs, *_window_ramp(setup), *_model_edits(setup)]
        return [*lrs, *_good_data_window(setup)]
    out = [Intervention(f"lr_x{factor:g}", f"with LR x{factor:g}", ("lr_too_high",), UPDATE,
                        Change(lr_factors=(factor,), autocast=setup.autocast))
           for factor in LR_FACTORS]
    state_step = setup.step if setup.state_step is None else setup.state_step
    ramp = (state_step + 1) / WARMUP_STEPS
    if ramp < 1 and setup.no_warmup is not False:
        out.append(Intervention("warmup", f"with the LR a {WARMUP_STEPS}-step warm-up gives at "
                                f"step {state_step} (x{ramp:.2g})", ("missing_warmup",), UPDATE,
                                Change(lr_factors=(ramp,), autocast=setup.autocast)))
    out += _precision_interventions(setup)
    out += _batch_interventions(setup)
    out += _model_edits(setup)
    if setup.baseline.grad_norm is not None:
        out.append(Intervention("clip", f"clipped at the run's typical norm "
                                f"{_num(setup.baseline.grad_norm)}", (), UPDATE,
                                Change(clip=setup.baseline.grad_norm, autocast=setup.autocast)))
    return out


def _model_edits(setup: Setup) -> list[Intervention]:
    """LoRA scalings above `LORA_SCALING` set to it; the layers the preflight (or their scale)
    found over-scaled re-drawn at `INIT_STD`. Both change the model before the replay, so over a
    window they act from its first step."""
    out = []
    rules_out = None if setup.rules_out else ()
    scalings = _lora_scalings(setup.model)
    if any(value > LORA_SCALING for value in scalings):
        out.append(Intervention("lora_scaling", f"with LoRA alpha/r {LORA_SCALING:g} (was "
                                f"{max(scalings):g})", ("lora_scaling",), FORWARD,
                                Change(edit=_set_lora_scaling, autocast=setup.autocast),
                                rules_out=rules_out))
    suspects = setup.init_suspects or _over_scaled(setup.model)
    if suspects:
        out.append(Intervention("head_init", f"with {', '.join(suspects)} re-drawn at std "
                                f"{INIT_STD:g}", ("bad_init",), FORWARD,
                                Change(edit=_reinit(suspects), autocast=setup.autocast),
                                rules_out=rules_out))
    return out


def _window_ramp(setup: Setup) -> list[Intervention]:
    """The window at the LRs a `WARMUP_STEPS`-step warm-up gives each of its steps (when the
    schedule has none and the window begins inside it)."""
    first = setup.window[0].step
    if setup.no_warmup is False or first + 1 >= WARMUP_STEPS:
        return []
    factors = tuple(min(1.0, (w.step + 1) / WARMUP_STEPS) for w in setup.window)
    last = min(1.0, (setup.step + 1) / WARMUP_STEPS)
    return [Intervention("warmup", f"with the LRs a {WARMUP_STEPS}-step warm-up gives steps "
                         f"{first}-{setup.step}", ("missing_warmup",), FORWARD,
                         Change(lr_factors=(last,), window_factors=factors,
                                autocast=setup.autocast),
                         rules_out=None if setup.rules_out else ())]


def left_level(step: WindowStep, typical_loss: float) -> bool:
    """The step's recorded loss left the run's typical level (above `WINDOW_SPIKE` times it), or
    is unknown or not finite."""
    return (step.loss is None or not math.isfinite(step.loss)
            or step.loss > WINDOW_SPIKE * max(typical_loss, 1e-8))


def _good_data_window(setup: Setup) -> list[Intervention]:
    """A window replayed at the run's own LRs with the batches from the step whose recorded loss
    left the run's typical level on replaced, in turn, by those before it (data the model did
    well on): healing, it confirms the data the window brought (`_data_causes`), and a lower LR
    that heals the window too only learned less from that data (`_conclude`). Nothing when the
    window's losses were bad from its first step (no good data to swap in) or are unknown."""
    base = setup.baseline.loss
    steps = setup.window
    if base is None:
        return []
    first_bad = next((i for i, w in enumerate(steps) if left_level(w, base)), len(steps))
    good = [w.batch for w in steps[:first_bad]]
    if not good or any(b is None for b in good):
        return []
    batches = tuple(w.batch if i < first_bad else good[(i - first_bad) % len(good)]
                    for i, w in enumerate(steps))
    last = good[(len(steps) - first_bad) % len(good)]
    swapped_from = steps[first_bad].step if first_bad < len(steps) else setup.step
    label = (f"the data — with the batches of steps {steps[0].step}-{steps[first_bad - 1].step} "
             f"in place of those from step {swapped_from} on")
    return [Intervention("good_data", label, _data_causes(setup), FORWARD,
                         Change(batch=last, window_batches=batches, autocast=setup.autocast),
                         rules_out=(), data=True)]


def _precision_interventions(setup: Setup) -> list[Intervention]:
    out = []
    half = any(p.dtype == torch.float16 for p in setup.model.parameters())
    if setup.autocast == torch.float16:
        out.append(Intervention("bf16", "in bf16", PRECISION_CAUSES, FORWARD,
                                Change(autocast=torch.bfloat16), rules_out=("fp16_overflow",)))
    elif half or setup.autocast is not None:
        # float16 weights: fp32 also gives Adam's eps and moments room, so it tests that too
        causes = (*PRECISION_CAUSES, "optimizer_eps") if half else PRECISION_CAUSES
        out.append(Intervention("fp32", "in fp32", causes, FORWARD,
                                Change(dtype=torch.float32), rules_out=("fp16_overflow",)))
    out.append(Intervention("float64", "with the loss computed in float64", ("numerical_op",),
                            FORWARD, Change(dtype=torch.float64), rules_out=()))
    # float64 heals an overflow, not log(0) or 0/0: a softmax whose other entries underflow to
    # exactly 0, or a count of 0, is the same at any precision
    out.append(Intervention("safe_ops", "with log(x) as log(max(x, tiny)) and x / 0 as x / 1",
                            ("numerical_op",), FORWARD,
                            Change(safe_ops=True, autocast=setup.autocast), rules_out=()))
    return out


_LOGS = frozenset({torch.log, torch.Tensor.log, torch.log2, torch.Tensor.log2, torch.log10,
                   torch.Tensor.log10})
_DIVS = frozenset({torch.div, torch.true_divide, torch.Tensor.div, torch.Tensor.true_divide,
                   torch.Tensor.__truediv__})


def _nonzero(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.masked_fill(value == 0, 1)
    return 1 if value == 0 else value


class _SafeOps(TorchFunctionMode):
    """log(x) as log(max(x, tiny)) and x / d with the zeros of d made 1 (the guide's
    log(x.clamp_min(eps)) and max(count, 1)): nothing else of the forward changes."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _LOGS and args and isinstance(args[0], torch.Tensor) \
                and args[0].is_floating_point():
            x = args[0]
            args = (x.clamp_min(torch.finfo(x.dtype).tiny), *args[1:])
        elif func in _DIVS and len(args) >= 2:
            args = (args[0], _nonzero(args[1]), *args[2:])
        elif func is torch.Tensor.__rtruediv__ and args:
            args = (_nonzero(args[0]), *args[1:])
        return func(*args, **kwargs)


def _batch_interventions(setup: Setup) -> list[Intervention]:
    """Without the flagged samples: confirms the causes their flags name. On the previous good
    batch: heals whatever this batch brought, so it confirms the data (`_data_causes`), not one
    data cause."""
    out = []
    flagged = flagged_samples(setup.batch, setup.model)
    size = _batch_size(setup.batch)
    if flagged and size is not None and len(flagged) < size:
        kept = [i for i in range(size) if i not in flagged]
        causes = tuple(c for c in BATCH_CAUSES
                       if any(c in FLAG_CAUSES[why] for why in flagged.values()))
        rows = sorted(flagged)
        out.append(Intervention(
            "drop_flagged", f"without the flagged sample{'s' if len(rows) > 1 else ''} "
            f"{', '.join(map(str, rows[:5]))}{' ...' if len(rows) > 5 else ''}", causes, FORWARD,
            Change(batch=_select(setup.batch, kept, size), autocast=setup.autocast)))
    if setup.previous_batch is not None:
        causes = _data_causes(setup)
        out.append(Intervention("previous_batch", "the data — on the previous good batch",
                                causes, FORWARD, Change(batch=setup.previous_batch,
                                                        autocast=setup.autocast),
                                rules_out=tuple(c for c in causes if c == ONE_BATCH), data=True))
    return out


def _data_causes(setup: Setup) -> tuple[str, ...]:
    """The data causes this batch can hold: the batch inspector's, a non-finite value when the
    batch has one (nothing else then: it explains a broken step alone), else one bad batch
    (`outlier_batch`, the ranking's generic one), a shifted scale for float inputs, a wrong
    tokenizer for token ids the model embeds, wrong labels, and no label to average when a field
    holds nothing but the ignore index."""
    fields = _fields(setup.batch)
    floats = [t for t in fields if t.is_floating_point()]
    named = {c for c in setup.batch_causes if c in DATA_CAUSES}
    with torch.no_grad():
        if any(not bool(torch.isfinite(t).all()) for t in floats):
            return tuple(c for c in DATA_CAUSES if c in named | {"nonfinite_input"})
        if any(not t.is_floating_point() and t.numel() and bool((t == IGNORE_INDEX).all())
               for t in fields):
            named.add("empty_loss")
    supported = named | {"outlier_batch", "label_problem"}
    if floats:
        supported.add("input_scale")
    embeds = any(isinstance(m, nn.Embedding) for m in setup.model.modules())
    if embeds and any(not t.is_floating_point() and t.dtype != torch.bool for t in fields):
        supported.add("tokenizer_mismatch")
    return tuple(c for c in DATA_CAUSES if c in supported)


def _lora_scalings(model: nn.Module) -> list[float]:
    values: list[float] = []
    for module in model.modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict) and hasattr(module, "lora_A"):
            values += [float(v) for v in scaling.values() if isinstance(v, (int, float))]
    return values


def _set_lora_scaling(model: nn.Module) -> None:
    """peft keeps alpha/r per adapter in `module.scaling` (`ReplayState` puts it back)."""
    for module in model.modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict) and hasattr(module, "lora_A"):
            for key in scaling:
                scaling[key] = LORA_SCALING


def _over_scaled(model: nn.Module) -> tuple[str, ...]:
    """Trainable linear and convolution weights far above their usual initial scale (the
    preflight's layer_init rule)."""
    out = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)) or (
                weight is None or not weight.requires_grad or weight.numel() < 2):
            continue
        with torch.no_grad():
            std = float(weight.float().std())
        if std >= INIT_SCALE_LIMIT * max(HF_INIT_STD, 1 / math.sqrt(weight[0].numel())):
            out.append(f"{name}.weight")
    return tuple(out)


def _reinit(params: Sequence[str]) -> Callable[[nn.Module], None]:
    def edit(model: nn.Module) -> None:
        named = dict(model.named_parameters())
        generator = torch.Generator().manual_seed(0)  # the run's RNG is left alone
        with torch.no_grad():
            for name in params:
                weight = named.get(name)
                if weight is None:
                    continue
                fresh = torch.randn(weight.shape, generator=generator) * INIT_STD
                weight.copy_(fresh.to(weight.device, weight.dtype))
                bias = named.get(name[: -len("weight")] + "bias")
                if bias is not None:
                    bias.zero_()
    return edit


def _fields(batch: Any) -> list[torch.Tensor]:
    return [tensor for _, tensor in named_tensors(batch)]


def _batch_size(batch: Any) -> int | None:
    sizes = {t.shape[0] for t in _fields(batch) if t.dim() > 0}
    return sizes.pop() if len(sizes) == 1 else None


def _select(batch: Any, keep: list[int], size: int) -> Any:
    if isinstance(batch, torch.Tensor):
        if batch.dim() > 0 and batch.shape[0] == size:
            return batch[torch.tensor(keep, device=batch.device)]
        return batch
    if isinstance(batch, Mapping):
        picked = {k: _select(v, keep, size) for k, v in batch.items()}
        try:
            return type(batch)(picked)  # type: ignore[call-arg]
        except Exception:
            return picked
    if isinstance(batch, (list, tuple)):
        return type(batch)(_select(v, keep, size) for v in batch)
    return batch


def flagged_samples(batch: Any, model: nn.Module | None = None) -> dict[int, str]:
    """Samples (rows along the batch dimension) holding NaN/inf ("nonfinite"), token ids outside
    the model's embedding table ("token_id"), or values far beyond the batch's median sample
    ("outlier"), with the reason."""
    size = _batch_size(batch)
    if size is None or size < 2:
        return {}
    vocab = next((m.num_embeddings for m in (model.modules() if model is not None else ())
                  if isinstance(m, nn.Embedding)), None)
    flagged: dict[int, str] = {}
    with torch.no_grad():
        for t in _fields(batch):
            if t.dim() == 0 or t.shape[0] != size:
                continue
            rows = t.reshape(size, -1)
            found: list[tuple[str, torch.Tensor]] = []
            if t.is_floating_point():
                peak = rows.float().abs().nan_to_num(0.0, 0.0, 0.0).amax(dim=1)
                found.append(("nonfinite", ~torch.isfinite(rows).all(dim=1)))
                found.append(("outlier", peak > FLAGGED_RATIO * peak.median().clamp_min(1e-12)))
            elif vocab is not None and t.dtype != torch.bool:
                found.append(("token_id", ((rows >= vocab) & (rows != -100)).any(dim=1)))
            for why, bad in found:
                for i in bad.nonzero().flatten().tolist():
                    flagged.setdefault(int(i), why)
    return flagged


# -- the proof -----------------------------------------------------------------------------------


def prove(setup: Setup, *, likely: Sequence[str] = (), budget_s: float | None = None) -> Proof:
    """Replay the step as it happened, then under each intervention that tests a cause in
    `likely` (cause codes, likeliest first; empty: every intervention), likeliest first, until
    `budget_s` is spent. Everything is put back afterwards.

    Before the run has a typical loss (its first steps), the lowest loss a replay that changes
    the step itself reached stands in for it: a step whose loss is `LOSS_SPIKE` times that is
    bad, as a step beyond the run's typical loss is later."""
    started = time.perf_counter()
    saved = ReplayState(setup.model, setup.optimizer)
    saved.step_rng = setup.forward_rng
    try:
        plain = setup.recorded  # stands only for a bad window the replay reproduces
        if plain is None or not record_stands(plain, setup.baseline) or not _first_step_agrees(
                setup, saved):
            plain = replay_step(setup, saved, Change(autocast=setup.autocast))
        origin = setup.origin + (" (as it happened: the losses the run recorded, its first step "
                                 "replayed to the same loss)" if plain.recorded else "")
        proof = Proof(setup.step, plain, setup.baseline, False, "", incident=setup.incident,
                      origin=origin, window=len(setup.window),
                      warned=setup.warned.what if setup.warned is not None else "",
                      recorded_loss=setup.original_loss, earlier=setup.earlier)
        # the replay gives another loss than the run recorded for the same state and batch: it
        # does not compute what the run did, and a fix of what it computes proves nothing
        differs = _differs(plain, setup.original_loss)
        early = setup.baseline.loss is None and setup.incident and plain.finite and not differs
        if plain.bad(setup.baseline) or early:
            _try_interventions(setup, saved, proof, _ordered(interventions(setup), likely),
                               started, budget_s)
        if early:
            proof.baseline = _provisional(proof)
        proof.why_bad = plain.bad(proof.baseline)
        proof.reproduced = bool(proof.why_bad) and not (
            setup.original_finite is False and plain.finite)
        proof.replay_differs = differs and not proof.reproduced
        # a step that ran non-finite and replays finite did not replay as it ran (a transient)
        proof.faithful = (False if setup.original_finite is False and plain.finite
                          else _faithful(plain.loss, setup.original_loss))
        if proof.reproduced:
            proof.trials = [(i, o, _heals(i, proof, o)) for i, o, _ in proof.trials]
            proof.damage_loss = setup.damage_loss
            proof.undamaged = _undamaged(setup, proof)
            if proof.undamaged:
                proof.trials = [(i, o, None if i.change.lr_factors != (1.0,) else h)
                                for i, o, h in proof.trials]
            _conclude(proof, likely)
        else:
            proof.trials = []
            proof.cannot_try, proof.cannot_try_causes = [], []
    finally:
        saved.restore()
    proof.seconds = time.perf_counter() - started
    return proof


def _undamaged(setup: Setup, proof: Proof) -> bool:
    """A window whose LR heals it, from a run whose model still does well on data from before
    the trouble (`Setup.damage_loss` within `WINDOW_SPIKE` of the typical loss)."""
    base = proof.baseline.loss
    return (bool(setup.window) and setup.damage_loss is not None and base is not None
            and math.isfinite(setup.damage_loss)
            and setup.damage_loss <= WINDOW_SPIKE * max(base, 1e-8)
            and any(h for i, _, h in proof.trials if i.change.lr_factors != (1.0,)))


FAITHFUL_TOLERANCE = 0.01
"""A plain replay whose loss is within this relative distance of the step's recorded loss
replayed the step as it ran (the same state, batch and dropout; kernels that are not
deterministic move it a little)."""


def _differs(plain: Outcome, recorded: float | None) -> bool:
    """The plain replay, from the state the step ran from, gives a loss other than the finite
    one the run recorded for it (beyond `SAME_LOSS`: more than other dropout masks or
    kernels move it)."""
    if plain.recorded or plain.error is not None or recorded is None or not math.isfinite(
            recorded):
        return False
    return not (math.isfinite(plain.loss)
                and abs(plain.loss - recorded) <= SAME_LOSS * max(abs(recorded), 1e-8))


def replays_record(replayed: Outcome, loss: float | None, grad_norm: float) -> bool:
    """Whether a step replayed from the state it ran from gives the loss and the gradient norm
    the run recorded for it, each within `SAME_LOSS` (non-finite where the record is): the run's
    record of that step is what the replay computes."""
    def same(now: float, was: float | None) -> bool:
        if was is None:
            return False
        if not math.isfinite(was):
            return not math.isfinite(now)
        return math.isfinite(now) and abs(now - was) <= SAME_LOSS * max(abs(was), 1e-12)
    return (replayed.error is None and same(replayed.loss, loss)
            and same(replayed.grad_norm, grad_norm))


def _faithful(replayed: float, recorded: float | None) -> bool | None:
    if recorded is None or not math.isfinite(recorded):
        return None
    if not math.isfinite(replayed):
        return False
    return abs(replayed - recorded) <= FAITHFUL_TOLERANCE * max(abs(recorded), 1e-6)


def recorded_window(window: Sequence[WindowStep], loss: float | None,
                    grad_norm: float) -> Outcome | None:
    """The plain window replay as the run recorded it: the median of the last `WINDOW_LAST`
    losses (the bad step's `loss` the last), the bad step's gradient norm; None when a loss was
    not recorded."""
    losses = [w.loss for w in window[-(WINDOW_LAST - 1):]] + [loss]
    if not window or any(v is None for v in losses):
        return None
    median = float(torch.tensor(losses, dtype=torch.float64).median())
    return Outcome("as_it_happened", "as the run recorded it", median, float(grad_norm),
                   math.nan, window=len(window), recorded=True)


def record_stands(recorded: Outcome, base: Baseline) -> bool:
    """Whether the run's record of a window may stand for its plain replay: bad even against a
    typical loss and gradient norm raised by `SAME_LOSS`, so that a replay within that share of
    the run's losses (`_first_step_agrees`) would find the window bad too."""
    if base.loss is None:
        return False
    raised = replace(base, loss=base.loss / (1 - SAME_LOSS),
                     grad_norm=None if base.grad_norm is None
                     else base.grad_norm / (1 - SAME_LOSS))
    return bool(recorded.forward_bad(raised))


def _first_step_agrees(setup: Setup, saved: ReplayState) -> bool:
    """Whether the window's first step, replayed from the state (its forward alone), gives the
    loss the run recorded for it: the replay reproduces the run's losses (one forward: a loss
    function or a state that differs from the run's would show here)."""
    first = setup.window[0] if setup.window else None
    if first is None or first.loss is None or not math.isfinite(first.loss):
        return False
    saved.restore()
    setup.model.train()
    try:
        with torch.no_grad(), _precision(setup, Change(autocast=setup.autocast)):
            saved.rng()
            if first.forward_rng is not None:
                put_torch_state(first.forward_rng)  # the step's own dropout masks
            loss = float(setup.loss_fn(setup.model, first.batch).detach().float())
    except Exception:  # the plain replay will say what fails
        return False
    finally:
        saved.restore()
    return math.isfinite(loss) and abs(loss - first.loss) <= SAME_LOSS * max(abs(first.loss),
                                                                            1e-8)


def _provisional(proof: Proof) -> Baseline:
    """The run's typical loss unknown: the lowest loss of a replay that changed the step."""
    losses = [o.loss for i, o, _ in proof.trials if i.aspect == FORWARD and o.finite]
    return replace(proof.baseline, loss=min(losses) if losses else None)


def _ordered(candidates: list[Intervention], likely: Sequence[str]) -> list[Intervention]:
    """The interventions testing a likely cause, likeliest first (those testing no cause
    last)."""
    if not likely:
        return candidates
    rank = {code: i for i, code in enumerate(likely)}
    tested = [i for i in candidates if any(c in rank for c in i.causes) or not i.causes
              or i.data]  # the data is a suspect whatever the votes (labels get none early)
    return sorted(tested, key=lambda i: min((rank[c] for c in i.causes if c in rank),
                                             default=len(rank)))


def _try_interventions(setup: Setup, saved: ReplayState, proof: Proof,
                       candidates: list[Intervention], started: float,
                       budget_s: float | None) -> None:
    # a replay is the window's steps, one update and one more forward
    per_update = (setup.update_seconds if proof.plain.recorded and setup.update_seconds
                  is not None else proof.plain.seconds / (len(setup.window) + 2))
    healed: set[str] = set()
    forward_bad = bool(proof.plain.forward_bad(setup.baseline))
    for intervention in candidates:
        if intervention.causes and set(intervention.causes) <= healed:
            continue  # a gentler change already healed it (LR x0.1 before x0.01)
        if intervention.aspect == UPDATE and forward_bad:
            # the step is bad before its update: a changed update can say nothing (said, with
            # what would let it be tried)
            proof.cannot_try.append(intervention.name)
            proof.cannot_try_causes += [c for c in intervention.causes
                                        if c not in proof.cannot_try_causes]
            continue
        cost = per_update * (len(setup.window) + len(intervention.change.lr_factors) + 1)
        if budget_s is not None and time.perf_counter() - started + cost > budget_s:
            proof.not_tried.append(intervention.name)
            proof.untested.update(intervention.causes)
            continue
        outcome = replay_step(setup, saved, intervention.change, intervention.name,
                              intervention.label)
        heals = _heals(intervention, proof, outcome)
        if heals:
            healed.update(intervention.causes)
        proof.trials.append((intervention, outcome, heals))
        if heals and setup.warned is not None:
            break  # over a window a lower LR calms any growth: the likeliest fix that does


def _heals(intervention: Intervention, proof: Proof, outcome: Outcome) -> bool | None:
    """Whether the intervention healed the step; None: it cannot tell (an update intervention
    on a step that was bad before its update, or the same crash as the plain replay)."""
    base, plain = proof.baseline, proof.plain
    if plain.error is not None and outcome.error == plain.error:
        return None  # the same crash: the loss function, not the fault, may be what failed
    if intervention.aspect == UPDATE:  # the step itself unchanged: only its update can heal
        if plain.forward_bad(base):
            return None
        return (outcome.finite and not outcome.update_bad()
                and _moved(intervention, plain, outcome, base))
    if base.signal_bound is not None and not (outcome.signal is not None
                                              and outcome.signal < base.signal_bound):
        return False  # the warned signal high, or not measured
    if intervention.data and base.grad_norm is not None and (
            outcome.grad_norm <= VANISHED * base.grad_norm):
        return False  # a good batch that no longer trains the model: the state is broken
    if (intervention.data and intervention.change.batch is not None and base.loss is not None
            and outcome.loss > WINDOW_SPIKE * max(base.loss, 1e-8)):
        return False  # the good batch is far from typical too: the state diverged, not the data
    return outcome.finite and not outcome.bad(base) and _moved(intervention, plain, outcome, base)


def _measure(intervention: Intervention, plain: Outcome, base: Baseline) -> str:
    """What a fix is judged in: the rise of the batch's loss over the update for a fix of the
    update, or of a step that was fine before its update; else what the plain replay's step is
    bad in."""
    if intervention.aspect == UPDATE or not plain.forward_bad(base):
        return BY_RISE
    return plain.forward_measure(base)


def _moved(intervention: Intervention, plain: Outcome, outcome: Outcome, base: Baseline) -> bool:
    """Whether the fix moved the value the plain replay is bad in by more than `SAME_LOSS` of
    it: a loss (or a gradient norm, or a rise over the update) within that share of the plain
    replay's is the same outcome (what replays of one step differ by), and a fix that leaves
    the outcome as it was changed nothing, whichever side of a threshold the two values fall.
    A warned signal is judged by its warning's bound alone: each has its own scale (log Z is a
    logarithm), and the bound is its detector's own margin."""
    if not plain.bad(base):
        return True  # nothing to move yet (the run's first steps: judged again later)
    measure = _measure(intervention, plain, base)
    if measure == BY_SIGNAL:
        return True
    was, now = plain.value(measure), outcome.value(measure)
    if not math.isfinite(was):
        return math.isfinite(now)
    return math.isfinite(now) and abs(now - was) > SAME_LOSS * max(abs(was), 1e-12)


def _conclude(proof: Proof, likely: Sequence[str] = ()) -> None:
    """Confirmed: a likely cause whose intervention healed the step (the data, only when no fix
    that keeps the batch healed it too). Ruled out: one whose every intervention left it
    bad."""
    healed: dict[str, str] = {}
    failed: dict[str, str] = {}
    by: dict[str, str] = {}
    for intervention, outcome, heals in proof.trials:
        rules_out = (intervention.causes if intervention.rules_out is None
                     else intervention.rules_out)
        for code in (c for c in intervention.causes
                     if not likely or c in likely or (heals and intervention.data)):
            if heals is None or (not heals and code not in rules_out):
                continue
            if heals:
                by.setdefault(code, intervention.name)
                healed.setdefault(code, f"confirmed by replay: {intervention.label} "
                                  f"{_healthy(intervention, outcome, proof)} instead of "
                                  f"{_bad_value(intervention, proof.plain, proof.baseline)}")
            else:
                failed.setdefault(code, f"ruled out: {intervention.label} "
                                  f"{outcome.bad(proof.baseline) or _still(outcome)}")
    # a fix of the forward, or of an update whose step was fine (its loss and gradients
    # typical: a lower LR that heals it), that keeps the batch: the same batch trains under it
    kept_batch = any(heals and not i.data and i.change.batch is None
                     for i, _, heals in proof.trials)
    # over a window a lower LR heals whatever the model learns from bad data; good data at the
    # run's own LRs healing it shows the data is enough: the LR's heal does not count
    window_data = bool(proof.window) and any(heals and i.data for i, _, heals in proof.trials)
    if window_data or kept_batch:
        # else the batch tripped the kept-batch fix's cause (a good batch "heals" an update too
        # big for any batch by chance: its own loss after the update says nothing of the LR)
        dropped_data = not window_data  # whose confirmations go: the data's, or the others'
        healed = {code: why for code, why in healed.items()
                  if not any(i.data == dropped_data and code in i.causes
                             and by.get(code) == i.name for i, _, _ in proof.trials)}
    proof.confirmed = healed
    proof.confirmed_by = {code: name for code, name in by.items() if code in healed}
    proof.ruled_out = {code: why for code, why in failed.items()
                       if code not in healed and code not in proof.untested}


def _healthy(intervention: Intervention, outcome: Outcome, proof: Proof) -> str:
    """The fix's value, in the measure the plain replay is bad in (`_measure`)."""
    base = proof.baseline
    measure = _measure(intervention, proof.plain, base)
    if measure == BY_SIGNAL:
        return (f"{base.signal_what} is {_num(outcome.value(BY_SIGNAL))} (the warning's bound "
                f"{_num(base.signal_bound if base.signal_bound is not None else math.nan)})")
    if measure == BY_GRAD_NORM:
        return (f"the gradient norm is {_num(outcome.grad_norm)}" + (
            f" (run's typical {_num(base.grad_norm)})" if base.grad_norm is not None else ""))
    typical = base.loss
    after = measure == BY_RISE
    what = "the loss after the update is" if after else f"{outcome.what()} is"
    return (f"{what} {_num(outcome.after if after else outcome.loss)}"
            + (f" (run's typical {_num(typical)})" if typical is not None else ""))


def _bad_value(intervention: Intervention, plain: Outcome, base: Baseline) -> str:
    """The plain replay's bad value, in the terms of `_healthy`: the loss after the update
    when the step itself was fine, else what its step is bad in."""
    recorded = " as the run recorded it" if plain.recorded else ""
    measure = _measure(intervention, plain, base)
    if measure == BY_RISE:
        return _num(plain.after)
    return _num(plain.value(measure)) + recorded


def _still(outcome: Outcome) -> str:
    return f"the step is still bad (loss {_num(outcome.loss)}, after it {_num(outcome.after)})"
