"""Compact encodings of the report's arrays, decoded by the page's own script (`page.BOOT_JS`).

A figure spec may hold, wherever plotly expects an array:

- `{"tg": "f8", "b64": ...}`: little-endian float64; NaN decodes to null (a gap);
- `{"tg": "i4", "b64": ...}`: little-endian int32 (steps; float64 beyond int32's range).

A heat map trace holds `"tggrid": {"array": KEY, "part": "values" | "flags"}` and the figure
set's `arrays[KEY]` holds the grid: little-endian int16 codes, row-major, rows x columns. A finite
cell is `lo + (code + 30000) * scale` in the map's colour units (log10 of the value for `log`
maps); the special codes below say what else a cell held. The "values" part draws the finite
cells, the "flags" part the non-finite ones in red, so no non-finite value hides as a gap.

Quantising to 60,001 levels over the map's own range keeps hover values to about 5 significant
digits at 2 bytes a cell (a 500 x 200 map: 270 kB of base64).
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np

from trainguard.report.downsample import FLAG_INF, FLAG_NAN, FLAG_NINF, Grid

MISSING, NAN, INF, NINF, MIXED, ZERO = -32768, -32767, -32766, -32765, -32764, -32763
"""Grid codes: no value; NaN; +inf; -inf; more than one non-finite kind; 0 or less on a log
map (drawn at the bottom of the colour scale)."""
LEVELS = 30000


def _b64(array: np.ndarray) -> str:
    return base64.b64encode(array.tobytes()).decode("ascii")


def floats(values: np.ndarray) -> dict[str, Any]:
    return {"tg": "f8", "b64": _b64(np.asarray(values, dtype="<f8"))}


def ints(values: np.ndarray) -> dict[str, Any]:
    """Whole numbers (steps): int32 when they fit, else float64 (exact up to 2**53)."""
    values = np.asarray(values, dtype=np.int64)
    if values.size and (values.min() < -2**31 or values.max() >= 2**31):
        return floats(values.astype(np.float64))
    return {"tg": "i4", "b64": _b64(values.astype("<i4"))}


def grid_codes(cells: Grid, log: bool) -> tuple[np.ndarray, float, float]:
    """(int16 codes [rows, columns], lo, scale) of a grid."""
    values = cells.values
    finite = np.isfinite(values)
    shown = finite & (values > 0) if log else finite
    with np.errstate(divide="ignore", invalid="ignore"):
        units = np.log10(np.where(shown, values, 1.0)) if log else np.where(shown, values, 0.0)
    if shown.any():
        lo, hi = float(units[shown].min()), float(units[shown].max())
    else:
        lo, hi = 0.0, 0.0
    scale = (hi - lo) / (2 * LEVELS) if hi > lo else 1.0
    codes = np.full(values.shape, MISSING, dtype="<i2")
    codes[shown] = (np.rint((units[shown] - lo) / scale) - LEVELS).astype(np.int64).clip(
        -LEVELS, LEVELS)
    if log:
        codes[finite & ~shown] = ZERO
    flags = cells.flags
    codes[flags == FLAG_NAN] = NAN
    codes[flags == FLAG_INF] = INF
    codes[flags == FLAG_NINF] = NINF
    codes[(flags != 0) & (flags != FLAG_NAN) & (flags != FLAG_INF) & (flags != FLAG_NINF)] = MIXED
    return codes, lo, scale


def grid(cells: Grid, log: bool) -> dict[str, Any]:
    """The `arrays` entry of a heat map."""
    codes, lo, scale = grid_codes(cells, log)
    return {"tg": "grid", "rows": int(codes.shape[0]), "cols": int(codes.shape[1]),
            "b64": _b64(codes), "lo": lo, "scale": scale, "log": log,
            "starts": ints(cells.starts), "ends": ints(cells.ends)}


def colour_range(cells: Grid, log: bool) -> tuple[float, float] | None:
    """(zmin, zmax) of the finite cells in colour units, None when there are none."""
    values = cells.values
    shown = np.isfinite(values) & (values > 0) if log else np.isfinite(values)
    if not shown.any():
        return None
    picked = values[shown]
    lo, hi = float(picked.min()), float(picked.max())
    if log:
        lo, hi = math.log10(lo), math.log10(hi)
    if hi <= lo:
        hi = lo + 1.0 if log else lo + max(abs(lo), 1.0) * 1e-6 + 1e-12
    return lo, hi
