"""A run's verdict as a value: the word (`vocabulary.Verdict`), the message that says why, and the
loss levels it was judged on. `trainguard.verdict` judges a run; this module holds only what it
hands on, at the bottom of trainguard's imports, so that the sinks, the store and the reports
that show a verdict import no judgement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainguard.vocabulary import Verdict


@dataclass(frozen=True, slots=True)
class RunVerdict:
    verdict: Verdict | None
    """`healthy`, `recovered`, `degraded` or `stalled`; None: too short to judge, as the
    message says."""
    message: str
    start: float | None
    before_trouble: float | None
    final: float | None
    trouble_step: int | None
    """The first step with trouble (a warning or worse)."""
    halt_step: int | None = None
    """The step the Guard halted the run at (None: it was not halted, or not at a known step)."""

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "message": self.message, "start": self.start,
                "before_trouble": self.before_trouble, "final": self.final,
                "trouble_step": self.trouble_step, "halt_step": self.halt_step}
