"""How values read in trainguard's text and JSON: numbers, times, sparklines, stored strings made
safe for a terminal, and the one strict-JSON spelling of NaN and inf.

This module sits below every part that prints (the command line, `analyze`, the HTML report, the
run store) and imports none of them."""

from __future__ import annotations

import math
import time
import unicodedata
from typing import Any


def short(value: Any) -> str:
    """A value for a table cell: 4 significant digits for floats, "-" for None."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def local_time(stamp: Any) -> str:
    """A Unix time as local `YYYY-MM-DD HH:MM:SS`; "-" when missing or not a number."""
    if (not isinstance(stamp, (int, float)) or isinstance(stamp, bool)
            or not math.isfinite(stamp)):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def visible(text: str) -> str:
    """`text` with control and format characters escaped (`\\x1b`, `\\n`, `\\u202e`), so that
    stored strings cannot move the cursor, recolour or rewrite a terminal."""
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char == " " or unicodedata.category(char) not in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co",
                                                             "Cn"):
            out.append(char)
        else:
            out.append(repr(char)[1:-1])
    return "".join(out)


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Any, width: int = 60) -> str:
    """A one-line curve of `values` in log scale, `width` cells at most; each cell shows the
    largest value of its bucket (a spike stays visible) and `!` where the bucket holds a NaN or
    inf (never hidden)."""
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return ""
    buckets = np.array_split(values, min(width, values.size))
    finite = values[np.isfinite(values) & (values > 0)]
    if finite.size == 0:
        return "".join("!" if not np.isfinite(b).all() else SPARKS[0] for b in buckets)
    low, high = np.log(finite.min()), np.log(finite.max())
    span = high - low if high > low else 1.0
    cells = []
    for bucket in buckets:
        if not np.isfinite(bucket).all():
            cells.append("!")
            continue
        top = bucket.max()
        level = 0.0 if top <= 0 else (np.log(top) - low) / span
        cells.append(SPARKS[int(np.rint(min(max(level, 0.0), 1.0) * (len(SPARKS) - 1)))])
    return "".join(cells)


def strict_json(value: Any) -> Any:
    """`value` for strict JSON readers: NaN and inf become the strings "nan", "inf", "-inf".

    The one spelling of non-finite numbers in trainguard's JSON output (`show --json`,
    `runs --json`, `doctor --json`, `analyze --json`): it stays valid JSON (no bare `NaN`
    literal) and a NaN stays visible as a NaN instead of turning into a null."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value
