"""A precursor that comes after the trouble it foretells is that trouble's aftermath.

`instability_precursor` warns that a loss spike often follows. Once the loss has jumped, the
gradients exploded or went non-finite, or the first updates blew the loss up (`bad_start`), a
signal that rises (log Z, Adam's ratio, the attention logits: all grow with the damage) predicts
nothing: the spike it would foretell is under way. Such an event is told as an `info` on the
trouble it follows, for `STEPS` steps after the last of it, instead of a warning of what is to
come.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from trainguard.events import Event, at_least
from trainguard.registry import Kind, Tag, kinds_tagged

STEPS = 20
"""How long after trouble a precursor is its aftermath: the adaptive clip's alarm
(`ClipConfig.auto_alarm_steps`' default), which treats the steps after a spike alike."""
AHEAD = ", and a loss spike often follows within "
"""How every precursor message foretells the spike; the aftermath's message ends before it."""


def is_trouble(event: Event) -> bool:
    """The loss or the gradients already went wrong: a jump shown to do harm (a warning or
    worse: a one-step outlier is an `info` until the next step), a non-finite loss or
    gradient, a start that blew the loss up."""
    if event.kind == Kind.INSTABILITY_PRECURSOR:
        return False
    if event.kind in kinds_tagged(Tag.JUMP) or event.kind == Kind.BAD_START:
        return at_least(event.severity, "warning")
    return event.kind in kinds_tagged(Tag.NONFINITE) and at_least(event.severity, "error")


class Aftermath:
    """The last trouble seen, and until which step a precursor is its aftermath."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.step = -1
        self.until = -1

    def tell(self, events: list[Event]) -> list[Event]:
        """`events` (a step's, every detector's, with those told late from calm rows first),
        with the precursors that come at or after trouble, within `STEPS` of it, told as its
        aftermath."""
        for event in events:
            if is_trouble(event) and event.step >= self.step:
                self.kind, self.step, self.until = event.kind, event.step, event.step + STEPS
        if self.kind is None:
            return events
        return [self._aftermath(event) if event.kind == Kind.INSTABILITY_PRECURSOR
                and at_least(event.severity, "warning")
                and self.step <= event.step < self.until else event for event in events]

    def _aftermath(self, event: Event) -> Event:
        when = (f"this step's {self.kind}" if event.step == self.step
                else f"the {self.kind} of step {self.step}")
        told = event.message.split(AHEAD)[0]
        return replace(event, severity="info",
                       message=f"{told}; it comes after {when}: part of that trouble, not a "
                               "warning of one to come",
                       details={**event.details, "aftermath_of": self.kind,
                                "aftermath_step": self.step})

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "until": self.until}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        kind = state.get("kind")
        self.kind = kind if isinstance(kind, str) else None
        self.step = int(state.get("step", -1))
        self.until = int(state.get("until", -1))
