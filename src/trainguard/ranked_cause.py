"""A likely cause of a run's trouble, ranked by the evidence for it (`diagnose.ranking`) or
confirmed by a replay (`diagnose.counterfactual`).

A value type at the bottom of trainguard's imports (the standard library only): the ranking that
makes it, the sinks, the store and the reports that show it, and the analysis of a log all
import it from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RankedCause:
    code: str
    confidence: float
    score: float
    evidence: list[str] = field(default_factory=list)
    fix: str = ""
    proof: str = ""
    """"confirmed" when a replay of the bad step proved it; "" for a cause ranked by votes."""

    def to_dict(self) -> dict[str, Any]:
        """`proof` only for a cause a replay confirmed."""
        out = {"code": self.code, "confidence": self.confidence, "score": self.score,
               "evidence": self.evidence, "fix": self.fix}
        return {**out, "proof": self.proof} if self.proof else out

    def __str__(self) -> str:
        said = "; ".join(self.evidence[:3]).rstrip(". ")  # evidence may end its own sentence
        return f"{self.code} ({self.confidence:.0%}): {said}. Fix: {self.fix}"
