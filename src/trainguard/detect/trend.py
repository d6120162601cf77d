"""How a precursor's signal moved, in the words of its warning and the number they rest on.

`instability_precursor` and the signals it composes (Adam's ratio, the attention logits, log Z,
Adam's update RMS) warn once a signal has stood above its own median for some steps: on a
level that rose. The warning says how the signal moved against where it was *before* those
steps and names that value ("up from 1.1 before them"), so the word is one its numbers show. A
noisy signal that climbs is not told as falling because its first step above the median
happened to be its highest.
"""

from __future__ import annotations

import math

RATIO_TOLERANCE = 1.05
"""A signal within 5% of where it was (a ratio) has not moved."""


def trend(value: float, before: float, *, tolerance: float = RATIO_TOLERANCE,
          additive: bool = False) -> str:
    """`rising`, `falling` or `flat`: `value` against `before`, by a factor of `tolerance`, or
    by `tolerance` added for a signal in log units (`additive`, log Z in nats)."""
    if not (math.isfinite(value) and math.isfinite(before)):
        return "flat"
    high, low = ((before + tolerance, before - tolerance) if additive
                 else (before * tolerance, before / tolerance))
    return "rising" if value > high else "falling" if value < low else "flat"


def since(trend_word: str, before: float) -> str:
    """The trend in words with the value it is read against: "up from 1.1 before them"."""
    if not math.isfinite(before):
        return "its value before them unknown"
    how = {"rising": "up from", "falling": "down from"}.get(trend_word, "level with the")
    return f"{how} {before:.3g} before them"
