"""The detector contract: `check(signals) -> events`, with explicit, serialisable state."""

from __future__ import annotations

from typing import Any

from trainguard.config import DetectorConfig
from trainguard.events import Event, Severity
from trainguard.signals import StepSignals


class Episode:
    """Reports an anomaly once: fires when it starts, re-arms after `rearm_steps` calm steps."""

    def __init__(self, rearm_steps: int) -> None:
        self.rearm_steps = rearm_steps
        self.active = False
        self.calm = 0

    def update(self, anomalous: bool) -> bool:
        """True when this step starts a new episode."""
        if anomalous:
            self.calm = 0
            if self.active:
                return False
            self.active = True
            return True
        if self.active:
            self.calm += 1
            if self.calm >= self.rearm_steps:
                self.active = False
                self.calm = 0
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"active": self.active, "calm": self.calm}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.active = bool(state["active"])
        self.calm = int(state["calm"])


class Detector:
    """Base class. Subclasses set `kind` and implement `check`; stateful ones extend the state
    methods so a resumed job keeps its baselines."""

    kind: str = ""
    reads: frozenset[str] = frozenset()
    """The `StepSignals` fields `check` reads, `step` aside (a property such as `loss_finite`
    counts as the field it derives from). The offline analyzer hands a detector the log's rows
    by what it reads and leaves it out of a log that holds none of it;
    `tests/detect/test_reads.py` checks the declaration against what `check` does."""
    reads_sampled_only: bool = False
    """True for detectors that only look at heavy-probe results (safe to run at close)."""
    live_only: bool = False
    """True for a detector that judges a whole run from its first step and cannot judge a log,
    which may be an excerpt that begins anywhere (a stall)."""
    judges_start: bool = False
    """True for a detector that judges the first steps of training: left out of a log that does
    not begin at the run's start."""

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config

    def check(self, signals: StepSignals) -> list[Event]:
        raise NotImplementedError

    def event(self, step: int, severity: Severity, message: str, *, param: str | None = None,
              value: float | None = None, **details: Any) -> Event:
        return Event(kind=self.kind, step=step, severity=severity, message=message, param=param,
                     value=value, details=details)

    def name_list(self, names: list[str]) -> str:
        shown = names[: self.config.max_named_params]
        more = len(names) - len(shown)
        return ", ".join(shown) + (f" and {more} more" if more > 0 else "")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state
