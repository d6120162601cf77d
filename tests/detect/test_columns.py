"""Column statistics of the precursor detectors (`detect/columns.py`)."""

from __future__ import annotations

import warnings

import numpy as np

from trainguard.detect.columns import column_medians


def test_column_medians_are_numpys_nanmedian() -> None:
    rng = np.random.default_rng(0)
    for rows in (1, 2, 7, 50):
        values = rng.normal(size=(rows, 9))
        values[rng.random(values.shape) < 0.3] = np.nan
        values[:, 0] = np.nan  # a parameter never measured
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = np.nanmedian(values, axis=0)
        np.testing.assert_array_equal(column_medians(values), expected)
