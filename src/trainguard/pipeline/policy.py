"""Policies turn a step's signals and shared events into the base decision of the `decide` stage.

    observe  record and warn; apply every step as configured (a fixed max_grad_norm included;
             the adaptive default clips nothing under observe)
    protect  clip to the limit in force (the adaptive default, or a fixed max_grad_norm); skip
             steps whose loss or gradients are non-finite; halt when
             `recovery.max_consecutive_skips` steps in a row had to be skipped, at once when such
             a step comes with the weights themselves non-finite (no skip can heal them), or
             when the replicas differ across ranks (`ddp_desync`: going on with different weights
             per rank is never wanted)
    recover  as protect here; the `decide` stage then asks `Recovery` for its judgement
    halt     as protect, but stop at the first event of `recovery.halt_severity` or worse

Comparisons are written so that NaN takes the safe branch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from trainguard.config import GuardConfig
from trainguard.events import Action, Event, at_least
from trainguard.registry import Kind
from trainguard.remedies.clip import clip_coefficient
from trainguard.signals import StepSignals

ClipAlarm = Literal["trouble", "precursor"]
"""What put the adaptive clip in alarm: trouble (an explosion, a spike), or only a precursor."""

APPLYING: frozenset[str] = frozenset({"applied", "clipped"})
"""The actions whose update the optimizer step applies."""


def applies(action: str | None) -> bool:
    """Whether a step with this action (or outcome) has its update applied: the one definition
    behind `Decision.applies_update` and `StepContext.applied`."""
    return action in APPLYING


@dataclass(frozen=True, slots=True)
class Decision:
    """What happens to one step's update. Made by the `decide` stage alone, immutable after it."""

    action: Action
    clip_coef: float = 1.0
    """The global clip factor (1.0 = untouched)."""
    reason: str = ""
    events: tuple[Event, ...] = ()
    """Events raised by the policy itself (a skip limit reached, recovery giving up)."""
    verdict: Any = None
    """The recover policy's `Verdict` behind a rollback (None otherwise)."""
    instead_of: Action | None = None
    """The action the recover policy chose that this one replaced (a rollback that an earlier
    proof says cannot heal the run, halted instead); a proof of the step proves that one."""
    clip_limit: float | None = None
    """The global clipping limit in force for the step (None: no clipping)."""
    clip_alarm: ClipAlarm | None = None
    """The step's events put the adaptive clip in alarm (None: they did not)."""

    @property
    def applies_update(self) -> bool:
        return applies(self.action)

    def with_clip(self, limit: float | None, alarm: ClipAlarm | None) -> Decision:
        """This decision with the step's clip limit in force and the clip's alarm:
        `dataclasses.replace` of the two, built directly (it runs every step)."""
        return Decision(self.action, self.clip_coef, self.reason, self.events, self.verdict,
                        self.instead_of, limit, alarm)


def choose_action(config: GuardConfig, signals: StepSignals, events: list[Event],
                  consecutive_skips: int, *, max_grad_norm: float | None = None,
                  adaptive: bool = False) -> Decision:
    """`max_grad_norm` is the step's limit in force (`remedies/limit.py`; None: no clipping);
    `adaptive` says it came from the adaptive default clip (for the reason given)."""
    finite = signals.loss_finite and signals.grads_finite
    if config.policy == "halt":
        serious = [e for e in events if at_least(e.severity, config.recovery.halt_severity)]
        if serious:
            return Decision("halted", reason=f"{serious[0].kind} at step {signals.step}")
    if config.policy == "protect":
        desync = next((e for e in events if e.kind == Kind.DDP_DESYNC), None)
        if desync is not None:  # training on with different replicas is never what is wanted
            return Decision("halted", reason=f"ddp_desync at step {signals.step}: the replicas "
                                             "differ across ranks")
    if config.policy != "observe" and not finite:
        if signals.amp_overflow:
            reason = "GradScaler overflow: the scaler skips this step and lowers its scale"
        else:
            reason = "non-finite loss or gradients"
        weights = next((e for e in events if e.kind == Kind.NONFINITE_WEIGHT), None)
        if config.policy == "protect" and weights is not None and not signals.amp_overflow:
            # the weights themselves are gone: no skipped update brings them back, and every
            # step from here is non-finite (`recover` rolls back to a good state instead)
            halt = Event(kind="skip_limit", step=signals.step, severity="critical",
                         message="non-finite weights: skipping cannot heal this run "
                                 f"({weights.message})", value=float(consecutive_skips + 1))
            return Decision("halted", reason="non-finite weights", events=(halt,))
        if (consecutive_skips + 1 >= config.recovery.max_consecutive_skips
                and not signals.amp_overflow):
            halt = Event(kind="skip_limit", step=signals.step, severity="critical",
                         message=f"{consecutive_skips + 1} consecutive steps had non-finite "
                                 "loss or gradients: skipping cannot heal this run",
                         value=float(consecutive_skips + 1))
            return Decision("halted", reason="skip limit reached", events=(halt,))
        return Decision("skipped", reason=reason)
    if signals.amp_overflow or (signals.loss_scale is not None and not signals.grads_finite):
        # even under observe, the scaler itself refuses to apply a step whose gradients are not
        # finite, whatever the loss (what `scaler.step` does without trainguard)
        return Decision("skipped", reason="GradScaler overflow")
    coef = clip_coefficient(signals.grad_norm, max_grad_norm)
    if coef < 1.0:
        reason = ("gradient norm abnormal for this run (above the adaptive limit)" if adaptive
                  else "gradient norm above max_grad_norm")
        return Decision("clipped", clip_coef=coef, reason=reason)
    return Decision("applied")
