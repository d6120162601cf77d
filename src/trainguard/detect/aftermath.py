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
    if event.kind in kinds_tagged(Tag.JUMP) or event.kind == Kind.BAD_START:
        return at_least(event.severity, "warning")
    return (event.kind in (Kind.NONFINITE_LOSS, Kind.NONFINITE_GRAD)
            and at_least(event.severity, "error"))


class Aftermath:
    """The last trouble seen: its step and kind (None: none yet)."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.step = -1

    def tell(self, events: list[Event]) -> list[Event]:
        """`events` (a step's, every detector's, with those told late from calm rows first),
        with each precursor that comes at or within `STEPS` after trouble (the latest at or
        before its step, this list's or one told before) told as that trouble's aftermath."""
        troubles = [(e.step, e.kind) for e in events if is_trouble(e)]
        if self.kind is not None:
            troubles.append((self.step, self.kind))
        if not troubles:
            return events
        told = [self._told(event, troubles) for event in events]
        self.step, self.kind = max(troubles)
        return told

    def _told(self, event: Event, troubles: list[tuple[int, str]]) -> Event:
        if event.kind != Kind.INSTABILITY_PRECURSOR or not at_least(event.severity, "warning"):
            return event
        before = [t for t in troubles if t[0] <= event.step]
        if not before:
            return event
        step, kind = max(before)
        return self._aftermath(event, step, kind) if event.step < step + STEPS else event

    @staticmethod
    def _aftermath(event: Event, step: int, kind: str) -> Event:
        when = f"this step's {kind}" if event.step == step else f"the {kind} of step {step}"
        told = event.message.split(AHEAD)[0]
        return replace(event, severity="info",
                       message=f"{told}; it comes after {when}: part of that trouble, not a "
                               "warning of one to come",
                       details={**event.details, "aftermath_of": kind, "aftermath_step": step})

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        kind = state.get("kind")
        self.kind = kind if isinstance(kind, str) else None
        self.step = int(state.get("step", -1))
