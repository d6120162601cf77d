"""A finding: something a check noticed about the configuration or the data, with its fix.

A value type at the bottom of trainguard's imports (it needs only `events.Severity`): the
checks that make findings, the sinks and the store that record them, and the analysis of a log
all import it from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainguard.events import Severity


@dataclass(slots=True)
class Finding:
    check: str
    """Stable name of the check that produced it (e.g. `lr_range`)."""
    severity: Severity
    message: str
    fix: str
    cause: str | None = None
    """The cause code (trainguard.diagnose.causes) this finding points to, if any."""
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "severity": self.severity, "message": self.message,
                "fix": self.fix, "cause": self.cause, "evidence": self.evidence}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        return cls(check=str(data["check"]), severity=data["severity"],
                   message=str(data["message"]), fix=str(data.get("fix", "")),
                   cause=data.get("cause"), evidence=dict(data.get("evidence") or {}))

    def __str__(self) -> str:
        return f"{self.severity.upper()} {self.check}: {self.message} Fix: {self.fix}"
