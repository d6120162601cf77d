"""How numbers and times read in trainguard's text (`show`, `runs`, the HTML report)."""

from __future__ import annotations

import math
import time
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
