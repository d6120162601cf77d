"""The precision a log writes its loss at, and the rises too small to be read at it.

Loggers round: the HF Trainer writes the loss to 4 decimals (`0.0003`), many console loggers to
2-4. A loss that sits a few units of its last written digit above 0 (the KL penalty of an RL
fine-tune starting at `0.0`, growing to `0.0008`) moves by ratios of 3x and 8x from one unit to
the next: rounding, not a jump. A rise of the loss is read as trouble only when it is at least
`UNITS` units of that digit; smaller ones are noted, not counted.
"""

from __future__ import annotations

import math

UNITS = 10
"""A rise of fewer units of the log's last written digit than this is within its rounding."""
MAX_DECIMALS = 6
"""Values written with more decimals than this are taken as written in full (no rounding)."""
SAMPLE = 2000
"""Values looked at to tell the rounding (a logger rounds every value alike)."""


def quantum(values: list[float | None]) -> float | None:
    """The unit of the last digit every finite value is written to (1e-4 for `0.0003`,
    `1.2345`), or None when the values are written in full precision."""
    decimals = 0
    seen = 0
    for value in values:
        if value is None or not math.isfinite(value) or value == 0:
            continue
        seen += 1
        for places in range(decimals, MAX_DECIMALS + 1):
            scaled = value * 10 ** places
            if abs(scaled - round(scaled)) <= 1e-9 * max(1.0, abs(scaled)):
                decimals = places
                break
        else:
            return None
        if seen >= SAMPLE:
            break
    return 10.0 ** -decimals if seen else None


def below_resolution(rise: float, unit: float | None) -> bool:
    """A rise of the loss too small, at the log's rounding, to be read as a jump or a climb."""
    return unit is not None and rise < UNITS * unit * (1 - 1e-9)
