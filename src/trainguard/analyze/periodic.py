"""Periodic structure in a logged loss: a sawtooth that is the data's doing, not trouble.

Batches grouped by length (the HF Trainer's `group_by_length`), a data loader that walks shards
in the same order each epoch, warm restarts: the loss rises and falls again and again with a
period. Its rises look like divergences to a detector that sees only the rows before them; with
the whole log in view they are one more tooth of the same saw. A loss is periodic when, with its
trend taken out, it correlates with itself one period later (`MIN_CORRELATION`) over at least
`MIN_PERIODS` periods; an incident in such a log that goes no higher than the loss had already
been, and come back from, after its first rows is its structure, not a verdict.
"""

from __future__ import annotations

import math

import numpy as np

MIN_CORRELATION = 0.5
"""The autocorrelation of the detrended loss at its period, at least."""
MIN_PERIODS = 3
"""Periods the log must hold before its structure is believed."""
SHORTEST = 3
"""The shortest period looked for, in rows (two rows up and down are noise, not a saw)."""
START_ROWS = 5
"""The first rows, where any loss is highest, are no tooth to compare with."""
ABOVE = 1.05
"""An incident that goes higher than the earlier teeth by more than this is more than one."""


def period(values: list[float | None]) -> tuple[int, float] | None:
    """(period in rows, autocorrelation there) of a periodic loss, or None."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if len(finite) < MIN_PERIODS * SHORTEST * 2 or len(finite) != len(values):
        return None  # a gap or a non-finite row: nothing periodic to say about it
    y = np.asarray(finite, dtype=np.float64)
    x = np.arange(len(y), dtype=np.float64)
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    norm = float(residual @ residual)
    if norm <= 0:
        return None
    n = len(y)
    # every lag's correlation at once through the FFT: n log n, for logs of any length
    spectrum = np.fft.rfft(residual, 2 * n)
    lagged = np.fft.irfft(spectrum * np.conj(spectrum))[:n]
    lags = np.arange(1, n // MIN_PERIODS + 1)
    r = lagged[lags] / norm * n / (n - lags)
    # a smooth curve correlates with itself a few rows on too: a period is the first peak
    # after the correlation has gone below 0 (a rise that comes back down, and up again)
    below = np.flatnonzero(r < 0)
    if not len(below):
        return None
    for k in range(int(below[0]) + 1, len(r) - 1):
        if r[k] >= MIN_CORRELATION and r[k] >= r[k - 1] and r[k] >= r[k + 1] \
                and lags[k] >= SHORTEST:
            return int(lags[k]), float(r[k])
    return None


def within_teeth(values: list[float | None], onset: int) -> bool:
    """The loss from `onset` on goes no higher than it had been after its first rows and
    before `onset`."""
    before = [v for v in values[START_ROWS:onset] if v is not None and math.isfinite(v)]
    after = [v for v in values[onset:] if v is not None and math.isfinite(v)]
    return bool(before) and bool(after) and max(after) <= ABOVE * max(before)
