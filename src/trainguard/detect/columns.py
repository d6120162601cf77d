"""Statistics over columns of recent values (one column per parameter or signal), NaN for a
value not measured: what the precursor detectors compare each column with."""

from __future__ import annotations

import numpy as np


def column_medians(values: np.ndarray) -> np.ndarray:
    """Each column's median over its non-NaN values (NaN for a column of nothing but NaN): what
    `np.nanmedian(values, axis=0)` gives, without its masked-array path, which took most of a
    small model's step (one sort; NaN sorts last)."""
    ordered = np.sort(values, axis=0)
    count = (~np.isnan(values)).sum(axis=0)
    columns = np.arange(values.shape[1])
    low = ordered[np.maximum((count - 1) // 2, 0), columns]
    high = ordered[np.maximum(count // 2, 0), columns]
    return np.where(count > 0, (low + high) / 2, np.nan)
