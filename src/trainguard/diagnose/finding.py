"""`Finding` lives in `trainguard.finding`, below every package that uses it; this name stays
valid for code that imports it from here."""

from trainguard.finding import Finding as Finding

__all__ = ["Finding"]
