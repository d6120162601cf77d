"""Downsampling keeps every spike, every dip and every non-finite value visible."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainguard.report import downsample
from trainguard.report.downsample import FLAG_INF, FLAG_NAN, FLAG_NINF


def test_buckets_cover_every_item_once() -> None:
    for n, buckets in ((10, 3), (100_000, 2000), (7, 50), (1, 1)):
        starts = downsample.bucket_starts(n, buckets)
        assert starts[0] == 0 and len(starts) == min(n, buckets)
        sizes = np.diff(np.append(starts, n))
        assert sizes.min() >= 1 and sizes.max() - sizes.min() <= 1
    assert downsample.bucket_starts(0, 10).size == 0


def test_a_short_series_is_kept_whole_with_gaps_for_non_finite_values() -> None:
    steps = np.arange(10)
    values = np.arange(10, dtype=float)
    values[[2, 5, 7]] = [math.nan, math.inf, -math.inf]
    missing = np.zeros(10, dtype=bool)
    missing[8] = True
    drawn = downsample.line(steps, values, max_points=100, missing=missing)
    assert list(drawn.steps) == list(range(10))
    assert np.isnan(drawn.values[[2, 5, 7, 8]]).all(), "no non-finite value reaches the line"
    assert [(m.kind, m.first, m.count) for m in drawn.marks] == [("NaN", 2, 1), ("inf", 5, 1),
                                                                 ("-inf", 7, 1)]
    assert drawn.counts == {"NaN": 1, "inf": 1, "-inf": 1}, "a missing value is not a NaN"
    assert drawn.marks[0].describe() == "NaN at step 2"


def test_every_spike_and_dip_survives_a_100k_series() -> None:
    rng = np.random.default_rng(0)
    n = 100_000
    steps = np.arange(n) * 2 + 5
    values = 1.0 + 0.01 * rng.standard_normal(n)
    spikes = rng.choice(n, size=40, replace=False)
    values[spikes[:20]] = 100.0 + np.arange(20)
    values[spikes[20:]] = -50.0 - np.arange(20)
    drawn = downsample.line(steps, values, max_points=4000)
    assert drawn.steps.size <= 4000
    assert np.all(np.diff(drawn.steps) > 0), "points in step order"
    kept = dict(zip(drawn.steps.tolist(), drawn.values.tolist(), strict=True))
    for index in spikes:
        assert kept.get(int(steps[index])) == values[index], f"the spike at {index} is drawn"
    assert drawn.values.max() == values.max() and drawn.values.min() == values.min()


def test_a_single_nan_among_100k_steps_is_marked_with_its_step() -> None:
    n = 100_000
    values = np.ones(n)
    values[[12_345, 99_999]] = [math.nan, math.inf]
    drawn = downsample.line(np.arange(n), values, max_points=1000)
    assert [(m.kind, m.first, m.last, m.count) for m in drawn.marks] == [
        ("NaN", 12_345, 12_345, 1), ("inf", 99_999, 99_999, 1)]
    assert drawn.nonfinite == 2


def test_many_nans_are_grouped_into_marks_that_cover_every_one() -> None:
    n = 100_000
    values = np.ones(n)
    bad = np.arange(0, n, 7)
    values[bad] = math.nan
    drawn = downsample.line(np.arange(n), values, max_points=2000, max_marks=500)
    assert len(drawn.marks) <= 500
    assert sum(m.count for m in drawn.marks) == bad.size == drawn.counts["NaN"]
    covered = np.zeros(n, dtype=bool)
    for mark in drawn.marks:
        covered[mark.first:mark.last + 1] = True
    assert covered[bad].all(), "every NaN step lies inside a mark"
    assert "NaN at " in drawn.marks[0].describe() and " steps in " in drawn.marks[0].describe()


def test_a_bucket_with_no_finite_value_breaks_the_line() -> None:
    n = 10_000
    values = np.ones(n)
    values[5000:5100] = math.nan
    drawn = downsample.line(np.arange(n), values, max_points=400)
    breaks = drawn.steps[np.isnan(drawn.values)]
    assert breaks.size and all(5000 <= s < 5100 for s in breaks)
    assert drawn.counts == {"NaN": 100}


def test_line_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="differ in shape"):
        downsample.line(np.arange(3), np.arange(4.0))


def test_grid_keeps_the_largest_value_and_flags_non_finite_cells() -> None:
    rng = np.random.default_rng(1)
    n, rows = 50_000, 70
    matrix = rng.random((n, rows))
    matrix[31_337, 3] = 1e6
    matrix[100, 5] = math.nan
    matrix[40_000, 6] = math.inf
    matrix[40_001, 6] = -math.inf
    missing = np.zeros(matrix.shape, dtype=bool)
    missing[:1000, 69] = True  # not yet watched
    matrix[:1000, 69] = math.nan
    cells = downsample.grid(np.arange(n), matrix, max_columns=200, missing=missing, chunk=16)
    assert cells.values.shape == (rows, 200) and cells.flags.shape == (rows, 200)
    column = int(np.searchsorted(cells.starts, 31_337, side="right") - 1)
    assert cells.values[3, column] == 1e6, "the spike is the cell's value"
    assert cells.flags[5, 0] == FLAG_NAN
    late = int(np.searchsorted(cells.starts, 40_000, side="right") - 1)
    assert cells.flags[6, late] == FLAG_INF | FLAG_NINF
    assert cells.counts == {"NaN": 1, "inf": 1, "-inf": 1}, "missing values are not NaN"
    assert not cells.measured[69, 0] and cells.flags[69, 0] == 0
    assert cells.measured[69, -1]
    assert cells.starts[0] == 0 and cells.ends[-1] == n - 1
    assert np.all(cells.ends[:-1] + 1 == cells.starts[1:])


def test_a_short_grid_has_one_column_per_step() -> None:
    matrix = np.array([[1.0, math.nan], [2.0, 3.0]])
    cells = downsample.grid(np.array([10, 20]), matrix, max_columns=200)
    assert list(cells.starts) == [10, 20] and list(cells.ends) == [10, 20]
    assert cells.values.tolist()[0] == [1.0, 2.0]
    assert math.isnan(cells.values[1, 0]) and cells.flags[1, 0] == FLAG_NAN


def test_an_empty_grid() -> None:
    cells = downsample.grid(np.zeros(0, dtype=np.int64), np.zeros((0, 4)))
    assert cells.values.shape == (4, 0) and cells.nonfinite == 0
