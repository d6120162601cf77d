"""Downsampling long series for the report, so a 100k-step run still draws at once.

Nothing the eye needs is lost on the way:

- a line keeps the lowest and the highest finite value of every bucket, at their own steps, so
  every spike (and every dip) stays on the curve;
- non-finite values never reach a line: each bucket that holds one gives a mark per kind (NaN,
  inf, -inf) with its first and last step and how many there were, so a single NaN among 100k
  steps still shows;
- a grid (a layer x step heat map) keeps the largest finite value of every bucket of steps, and
  flags each cell that held a non-finite value, whatever else it held.

Missing values (a step that recorded no loss, a parameter not yet watched) are neither: they
break a line and leave a grid cell empty.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

NONFINITE_KINDS = ("NaN", "inf", "-inf")
FLAG_NAN, FLAG_INF, FLAG_NINF = 1, 2, 4
"""Bits of `Grid.flags`: the cell held a NaN, a +inf, a -inf."""


@dataclass(frozen=True, slots=True)
class Mark:
    """Non-finite values of one kind in one stretch of steps."""

    kind: str
    """"NaN", "inf" or "-inf"."""
    first: int
    last: int
    count: int

    def describe(self) -> str:
        if self.count == 1:
            return f"{self.kind} at step {self.first}"
        return f"{self.kind} at {self.count} steps in {self.first}..{self.last}"


@dataclass(frozen=True, slots=True)
class Line:
    """A drawable line: finite points, with NaN where the line breaks."""

    steps: np.ndarray
    values: np.ndarray
    marks: list[Mark]
    counts: dict[str, int]
    """How many values of each non-finite kind the whole series held (before downsampling)."""

    @property
    def nonfinite(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True, slots=True)
class Grid:
    """A rows x columns heat map over buckets of steps."""

    starts: np.ndarray
    """First step of each column."""
    ends: np.ndarray
    """Last step of each column."""
    values: np.ndarray
    """[rows, columns]: the largest finite value of the cell (NaN where it held none)."""
    flags: np.ndarray
    """[rows, columns] uint8: bits FLAG_NAN, FLAG_INF, FLAG_NINF of the non-finite values held."""
    measured: np.ndarray
    """[rows, columns] bool: whether the cell held any value at all (missing ones excluded)."""
    counts: dict[str, int]
    """How many values of each non-finite kind the whole matrix held (before downsampling)."""

    @property
    def nonfinite(self) -> int:
        return sum(self.counts.values())


def bucket_starts(n: int, buckets: int) -> np.ndarray:
    """Start indices of at most `buckets` contiguous, near-equal buckets over `n` items."""
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    buckets = max(1, min(int(buckets), n))
    return np.unique((np.arange(buckets, dtype=np.int64) * n) // buckets)


def _kind_masks(values: np.ndarray, present: np.ndarray) -> list[tuple[str, np.ndarray]]:
    return [("NaN", np.isnan(values) & present), ("inf", np.isposinf(values) & present),
            ("-inf", np.isneginf(values) & present)]


def nonfinite_counts(values: np.ndarray, missing: np.ndarray | None = None) -> dict[str, int]:
    """Non-finite values by kind (missing ones excluded); kinds that do not occur are left out."""
    present = np.ones(values.shape, dtype=bool) if missing is None else ~missing
    counts = {kind: int(mask.sum()) for kind, mask in _kind_masks(values, present)}
    return {kind: count for kind, count in counts.items() if count}


def marks(steps: np.ndarray, values: np.ndarray, max_marks: int,
          missing: np.ndarray | None = None) -> list[Mark]:
    """Every non-finite value as a mark; past `max_marks` of one kind, one mark per bucket of
    steps (first, last, count) instead, so none is ever dropped. Sorted by first step."""
    steps = np.asarray(steps, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    present = np.ones(values.shape, dtype=bool) if missing is None else ~missing
    out: list[Mark] = []
    n = values.size
    for kind, mask in _kind_masks(values, present):
        where = np.flatnonzero(mask)
        if not where.size:
            continue
        if where.size <= max_marks:
            out.extend(Mark(kind, int(steps[i]), int(steps[i]), 1) for i in where)
            continue
        size = math.ceil(n / max(1, max_marks))
        _, first, count = np.unique(where // size, return_index=True, return_counts=True)
        for start, many in zip(first, count, strict=True):
            out.append(Mark(kind, int(steps[where[start]]), int(steps[where[start + many - 1]]),
                            int(many)))
    out.sort(key=lambda m: (m.first, NONFINITE_KINDS.index(m.kind)))
    return out


def line(steps: np.ndarray, values: np.ndarray, max_points: int = 4000,
         missing: np.ndarray | None = None, max_marks: int = 2000) -> Line:
    """A line of at most about `max_points` points: all of them when the series is short, else
    the min and max of each of `max_points // 2` buckets. A bucket without a finite value breaks
    the line (a NaN point at its first step)."""
    steps = np.asarray(steps, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    if steps.shape != values.shape:
        raise ValueError(f"steps {steps.shape} and values {values.shape} differ in shape")
    finite = np.isfinite(values)
    if missing is not None:
        finite &= ~missing
    found = marks(steps, values, max_marks, missing)
    counts = nonfinite_counts(values, missing)
    n = values.size
    if n <= max_points:
        return Line(steps.copy(), np.where(finite, values, np.nan), found, counts)
    starts = bucket_starts(n, max(1, max_points // 2))
    ends = np.append(starts[1:], n)
    # Near-equal buckets: pad them to a rectangle and take each row's argmin and argmax.
    width = int((ends - starts).max())
    index = np.minimum(starts[:, None] + np.arange(width)[None, :], ends[:, None] - 1)
    ok = finite[index]
    rows = np.arange(starts.size)
    at_low = index[rows, np.where(ok, values[index], np.inf).argmin(axis=1)]
    at_high = index[rows, np.where(ok, values[index], -np.inf).argmax(axis=1)]
    has = ok.any(axis=1)
    chosen = np.unique(np.concatenate([at_low[has], at_high[has]]))
    breaks = starts[~has]
    out_steps = np.concatenate([steps[chosen], steps[breaks]])
    out_values = np.concatenate([values[chosen], np.full(breaks.size, np.nan)])
    order = np.argsort(out_steps, kind="stable")
    return Line(out_steps[order], out_values[order], found, counts)


def grid(steps: np.ndarray, matrix: np.ndarray, max_columns: int = 200,
         missing: np.ndarray | None = None, chunk: int = 64) -> Grid:
    """A [rows = matrix columns, columns = step buckets] grid of `matrix[step, row]`: per cell
    the largest finite value, its non-finite flags and whether it held any value."""
    steps = np.asarray(steps, dtype=np.int64)
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != steps.size:
        raise ValueError(f"matrix {matrix.shape} does not have one row per step ({steps.size})")
    if missing is not None and missing.shape != matrix.shape:
        raise ValueError(f"missing {missing.shape} and matrix {matrix.shape} differ in shape")
    n, rows = matrix.shape
    starts = bucket_starts(n, max_columns)
    columns = starts.size
    values = np.full((rows, columns), np.nan)
    flags = np.zeros((rows, columns), dtype=np.uint8)
    measured = np.zeros((rows, columns), dtype=bool)
    counts = {kind: 0 for kind in NONFINITE_KINDS}
    if n and rows:
        for first in range(0, rows, chunk):  # bounded temporaries for 100k x 500
            part = matrix[:, first:first + chunk]
            present = (np.ones(part.shape, dtype=bool) if missing is None
                       else ~missing[:, first:first + chunk])
            finite = np.isfinite(part) & present
            peak = np.maximum.reduceat(np.where(finite, part, -np.inf), starts, axis=0)
            got = np.logical_or.reduceat(finite, starts, axis=0)
            values[first:first + chunk] = np.where(got, peak, np.nan).T
            measured[first:first + chunk] = np.logical_or.reduceat(present, starts, axis=0).T
            for bit, (kind, mask) in zip((FLAG_NAN, FLAG_INF, FLAG_NINF),
                                         _kind_masks(part, present), strict=True):
                counts[kind] += int(mask.sum())
                hit = np.logical_or.reduceat(mask, starts, axis=0).T
                flags[first:first + chunk] |= np.where(hit, bit, 0).astype(np.uint8)
    ends = np.append(steps[starts[1:] - 1], steps[-1]) if n else np.zeros(0, dtype=np.int64)
    return Grid(steps[starts], ends, values, flags, measured,
                {kind: count for kind, count in counts.items() if count})
