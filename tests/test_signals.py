from __future__ import annotations

import copy
import json
import math
import random

import numpy as np
import pytest

from trainguard.signals import (
    MAD_TO_STD,
    LossCurvature,
    RobustBaseline,
    StepSignals,
    safe_log,
    settled_at,
)


@pytest.mark.parametrize("value, expected", [(1.0, 0.0), (math.e, 1.0), (1e-30, math.log(1e-30)),
                                             (1e300, math.log(1e300))])
def test_safe_log_of_positive_values(value: float, expected: float) -> None:
    assert safe_log(value) == pytest.approx(expected)


def test_safe_log_of_zero_is_minus_inf() -> None:
    assert safe_log(0.0) == -math.inf


@pytest.mark.parametrize("value", [-1.0, -1e-12, math.nan, math.inf, -math.inf])
def test_safe_log_of_negative_or_nonfinite_is_nan(value: float) -> None:
    assert math.isnan(safe_log(value))


def test_median_and_mad_odd_count() -> None:
    baseline = RobustBaseline(window=10, min_scale=0.01)
    for v in (0.0, 1.0, 2.0, 3.0, 100.0):
        baseline.admit(v)
    median, scale = baseline.stats()
    assert median == 2.0
    # deviations 2, 1, 0, 1, 98 -> MAD 1
    assert scale == pytest.approx(MAD_TO_STD)


def test_median_and_mad_even_count() -> None:
    baseline = RobustBaseline(window=10, min_scale=0.01)
    for v in (4.0, 1.0, 3.0, 2.0):
        baseline.admit(v)
    median, scale = baseline.stats()
    assert median == 2.5
    # deviations 1.5, 0.5, 0.5, 1.5 -> MAD 1
    assert scale == pytest.approx(MAD_TO_STD)


def test_spread_is_bit_for_bit_the_median_of_absolute_deviations() -> None:
    """The spread is read off the sorted window (median - v below the median, v - median above
    it): the same floats as the median of abs(v - median) over the window, ties, values equal to
    the median and a sliding window included."""
    rng = random.Random(0)
    for window in (1, 2, 5, 8, 9, 64):
        baseline = RobustBaseline(window=window, min_scale=0.0)
        for _ in range(300):
            value = rng.choice([rng.gauss(0.0, 1.0), round(rng.gauss(0.0, 1.0), 1), 0.1])
            baseline.admit(value)
            baseline._scale = None  # recompute the spread at every value
            median, scale = baseline.stats()
            deviations = sorted(abs(v - median) for v in baseline.values)
            n = len(deviations)
            mad = (deviations[n // 2] if n % 2
                   else 0.5 * (deviations[n // 2 - 1] + deviations[n // 2]))
            assert scale == max(mad * MAD_TO_STD, 0.0)


def test_scale_is_floored_on_a_constant_signal() -> None:
    baseline = RobustBaseline(window=10, min_scale=0.05)
    for _ in range(10):
        baseline.admit(1.0)
    assert baseline.stats() == (1.0, 0.05)


def test_mad_matches_normal_std_on_gaussian_data() -> None:
    rng = np.random.default_rng(0)
    baseline = RobustBaseline(window=5000, min_scale=1e-6)
    for v in rng.normal(3.0, 0.4, 5000):
        baseline.admit(float(v))
    median, scale = baseline.stats()
    assert median == pytest.approx(3.0, abs=0.03)
    assert scale == pytest.approx(0.4, rel=0.05)


def test_only_the_last_window_values_count() -> None:
    baseline = RobustBaseline(window=3, min_scale=0.01)
    for v in range(10):
        baseline.admit(float(v))
    assert len(baseline) == 3
    assert baseline.stats()[0] == 8.0


def test_nonfinite_values_are_never_admitted() -> None:
    baseline = RobustBaseline(window=5, min_scale=0.01)
    for v in (1.0, 2.0, 3.0):
        baseline.admit(v)
    before = baseline.stats()
    for bad in (math.nan, math.inf, -math.inf, safe_log(0.0), safe_log(-2.0), safe_log(math.nan)):
        baseline.admit(bad)
    assert len(baseline) == 3
    assert baseline.stats() == before
    assert all(math.isfinite(v) for v in baseline.values)


def test_one_outlier_does_not_move_the_median() -> None:
    baseline = RobustBaseline(window=50, min_scale=0.01)
    for i in range(20):
        baseline.admit(1.0 + 0.01 * (i % 3))
    median = baseline.stats()[0]
    baseline.admit(1e6)
    assert baseline.stats()[0] == pytest.approx(median, abs=0.011)


def test_stats_are_recomputed_after_admit() -> None:
    baseline = RobustBaseline(window=3, min_scale=0.01)
    baseline.admit(1.0)
    assert baseline.stats()[0] == 1.0
    baseline.admit(5.0)
    baseline.admit(6.0)
    assert baseline.stats()[0] == 5.0


def test_state_round_trips_through_json() -> None:
    baseline = RobustBaseline(window=4, min_scale=0.05)
    for v in (0.5, -1.0, 2.0, 0.25, 7.0):
        baseline.admit(v)
    state = json.loads(json.dumps(baseline.state_dict(), allow_nan=True))
    clone = RobustBaseline(window=4, min_scale=0.05)
    clone.load_state_dict(state)
    assert list(clone.values) == list(baseline.values)
    assert clone.stats() == baseline.stats()
    baseline.admit(3.0)
    clone.admit(3.0)
    assert clone.stats() == baseline.stats()
    assert len(clone) == 4


def test_loading_more_values_than_the_window_keeps_the_latest() -> None:
    baseline = RobustBaseline(window=3, min_scale=0.05)
    baseline.load_state_dict({"values": [1.0, 2.0, 3.0, 4.0, 5.0]})
    assert list(baseline.values) == [3.0, 4.0, 5.0]
    assert baseline.stats()[0] == 4.0


def test_loading_state_invalidates_cached_stats() -> None:
    baseline = RobustBaseline(window=5, min_scale=0.05)
    baseline.admit(1.0)
    assert baseline.stats()[0] == 1.0
    baseline.load_state_dict({"values": [9.0]})
    assert baseline.stats()[0] == 9.0


def test_step_signals_finiteness_helpers() -> None:
    names = ["a.weight", "b.weight", "c.bias"]
    healthy = StepSignals(step=0, loss=1.0, grad_norm=2.0,
                          param_grad_norm=np.array([1.0, 1.0, 1.0]), param_names=names)
    assert healthy.loss_finite and healthy.grads_finite
    assert healthy.nonfinite_params() == []
    bad = StepSignals(step=1, loss=math.nan, grad_norm=math.inf,
                      param_grad_norm=np.array([1.0, math.inf, math.nan]), param_names=names)
    assert not bad.loss_finite and not bad.grads_finite
    assert bad.nonfinite_params() == ["b.weight", "c.bias"]
    no_loss = StepSignals(step=2, loss=None, grad_norm=1.0, param_grad_norm=np.ones(3),
                          param_names=names)
    assert no_loss.loss_finite


def _history(baseline: RobustBaseline, rng: random.Random, count: int) -> None:
    """Values admitted with `stats` asked now and then, as detectors ask it."""
    for _ in range(count):
        if baseline.values and rng.random() < 0.5:
            baseline.stats()
        baseline.admit(rng.gauss(0.0, 1.0))


@pytest.mark.parametrize("window", [1, 3, 8, 9, 10, 33])
@pytest.mark.parametrize("stats_first", [True, False])
def test_admit_all_leaves_the_state_of_admit_one_by_one(window: int, stats_first: bool) -> None:
    """`admit_all` holds what `admit` with `stats` at every value holds: the values, their
    order, the cached spread and when it is next refreshed (so the spread the next `stats`
    gives is the same), from any history: a young window, a full one, a cache just refreshed
    or about to be."""
    rng = random.Random(window * 2 + stats_first)
    for _ in range(200):
        baseline = RobustBaseline(window, 0.01)
        _history(baseline, rng, rng.randrange(0, 3 * window + 10))
        values = np.array([rng.gauss(0.0, 1.0) for _ in range(rng.randrange(0, 5 * window + 20))])
        one_by_one = copy.deepcopy(baseline)
        for value in values:
            if stats_first and one_by_one.values:
                one_by_one.stats()
            one_by_one.admit(float(value))
            if not stats_first:
                one_by_one.stats()
        baseline.admit_all(values, stats_first=stats_first)
        assert baseline.state_dict() == one_by_one.state_dict()
        if baseline.values:
            assert baseline.stats() == one_by_one.stats()


def test_observe_all_is_observe_of_each_loss() -> None:
    rng = random.Random(0)
    losses: list[float | None] = [rng.choice([None, math.nan, 0.0, -1.0, math.inf])
                                  if rng.random() < 0.1 else math.exp(rng.gauss(0, 1))
                                  for _ in range(500)]
    for begun in (0, 2, 9):  # from the start, and from a state with some levels known
        one, batch = LossCurvature(span=5), LossCurvature(span=5)
        for loss in losses[:begun]:
            one.observe(loss)
            batch.observe(loss)
        assert batch.observe_all(losses[begun:]) == [one.observe(loss) for loss in losses[begun:]]
        assert batch.state_dict() == one.state_dict()


@pytest.mark.parametrize("decay", [0.0, 0.5, 2 / 3, 0.9, 0.999])
def test_settled_at_is_where_the_bias_correction_becomes_one(decay: float) -> None:
    n = settled_at(decay)
    assert all(1.0 - decay ** k == 1.0 for k in range(n, n + 500))
    assert n == 1 or 1.0 - decay ** (n - 1) != 1.0
