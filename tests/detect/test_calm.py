"""The detectors' offline fast path (`Detector.skip_calm`) decides exactly as `check` row by
row: the same events, and the same state after the last row, on series of every shape (spikes,
NaN, a slow divergence, a sawtooth, plateaus, gradients that stop, LR jumps), with windows of
the default length and of a sparse log's few rows. On a calm series it skips most rows."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable

import numpy as np
import pytest

from tests.detect.synth import event_key
from trainguard.detect import DETECTOR_TYPES, Detector
from trainguard.detect.calm import SignalColumns, window_medians
from trainguard.detect.settings import CommonConfig, DetectorConfig
from trainguard.events import Event
from trainguard.signals import StepSignals

FAST = [t for t in DETECTOR_TYPES if t.skip_calm is not Detector.skip_calm]


def test_the_fast_paths_are_those_of_the_detectors_a_log_feeds() -> None:
    assert {t.kind for t in FAST} >= {"loss_spike", "grad_explosion", "loss_divergence",
                                      "lr_change", "no_gradients", "nonfinite_loss",
                                      "nonfinite_grad", "bad_start"}


def _columns(rows: list[StepSignals]) -> SignalColumns:
    def floats(values: list[float | None]) -> np.ndarray:
        return np.array([math.nan if v is None else v for v in values], dtype=np.float64)

    groups = max((len(s.group_lrs) for s in rows), default=1) or 1
    lrs = np.full((len(rows), groups), math.nan)
    for i, s in enumerate(rows):
        lrs[i, :len(s.group_lrs)] = s.group_lrs
    return SignalColumns(
        step=np.array([s.step for s in rows], dtype=np.int64),
        loss=floats([s.loss for s in rows]),
        has_loss=np.array([s.loss is not None for s in rows]),
        grad_norm=floats([s.grad_norm for s in rows]),
        amp_overflow=np.array([s.amp_overflow for s in rows]),
        group_lrs=lrs, has_lr=np.array([bool(s.group_lrs) for s in rows]),
        loss_curvature=floats([s.loss_curvature for s in rows]),
        has_curvature=np.array([s.loss_curvature is not None for s in rows]))


def _fast(detector: Detector, rows: list[StepSignals], rng: random.Random) -> tuple[list[Event],
                                                                                    int]:
    """`check` on the rows `skip_calm` does not skip (looking ahead by stretches of random
    length, as far as the contract allows): the events, and how many rows `check` saw."""
    columns, events, checked, position = _columns(rows), [], 0, 0
    while position < len(rows):
        end = min(len(rows), position + rng.choice([1, 2, 7, 64, 1000, len(rows)]))
        skipped_to = detector.skip_calm(columns, position, end)
        assert position <= skipped_to <= end
        position = skipped_to
        if position == end:
            continue
        events.extend(detector.check(rows[position]))
        checked += 1
        position += 1
    return events, checked


def _series(shape: str, n: int, rng: np.random.Generator) -> list[StepSignals]:
    t = np.arange(n)
    loss = 2.5 * np.exp(-t / (n / 3)) + 0.3
    grad = np.exp(rng.normal(0, 0.1, n))
    lr = 1e-4 * np.minimum(1.0, (t + 1) / 20)
    if shape == "spikes":
        for at in rng.choice(n, 6, replace=False):
            loss[at] *= 20
            grad[at] *= 50
        loss[n // 2:n // 2 + 3] *= 5
    elif shape == "nan":
        loss[n // 3:n // 3 + 4] = math.nan
        grad[n // 3:n // 3 + 2] = math.inf
        loss[2 * n // 3:] = math.nan
    elif shape == "slow_divergence":
        loss = loss * np.exp(np.maximum(0, t - n // 2) / (n / 10))
    elif shape == "sawtooth":
        loss = 1.0 + 0.8 * (t % 25) / 25
    elif shape == "plateaus":
        loss = np.where(t < n // 3, 2.0, np.where(t < 2 * n // 3, 1.0, 3.0))
        grad[n // 2:n // 2 + 40] = 0.0
    elif shape == "lr_jumps":
        lr[n // 4:] *= 10
        lr[n // 2:] *= 1000
    elif shape == "lr_zero":  # a blip at 0, a stretch at 0, back, and 0 to the end
        lr[n // 4:n // 4 + 5] = 0.0
        lr[n // 2:n // 2 + 30] = 0.0
        lr[n - 100:] = 0.0
    elif shape == "heavy_tails":  # jumps of every size, many of them near the thresholds
        loss = loss * np.exp(0.3 * rng.standard_t(2, n))
        grad = np.exp(0.8 * rng.standard_t(2, n))
        lr = lr * np.exp(rng.uniform(0, 1.3, n))
    loss = loss * np.exp(rng.normal(0, 0.03, n))
    rows = []
    for i in range(n):
        value: float | None = float(loss[i])
        if i % 97 == 5:
            value = None  # a row without a loss
        elif i % 211 == 7:
            value = 0.0
        group = (float(lr[i]), float(lr[i]) * (3.0 if i > n // 3 else 1.0))
        rows.append(StepSignals(step=i, loss=value, grad_norm=float(grad[i]),
                                param_grad_norm=np.zeros(0), param_names=[], lr=float(lr[i]),
                                group_lrs=() if i % 89 == 3 else group,
                                amp_overflow=i % 151 == 9,
                                loss_curvature=None if i < 3 else float(rng.normal(0, 1e-3))))
    return rows


SHAPES = ("calm", "spikes", "nan", "slow_divergence", "sawtooth", "plateaus", "lr_jumps",
          "lr_zero", "heavy_tails")
CONFIGS: dict[str, Callable[[], DetectorConfig]] = {
    "default": DetectorConfig,
    # a log written every 10 steps: windows of a few rows (a spread refreshed at every value)
    "sparse": lambda: dataclasses.replace(
        DetectorConfig(), common=CommonConfig(baseline_window=5, warmup_steps=2, rearm_steps=2)),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", FAST, ids=lambda t: t.kind)
def test_the_fast_path_decides_as_check_row_by_row(kind: type[Detector], shape: str,
                                                    config: str) -> None:
    rows = _series(shape, 1500, np.random.default_rng(len(shape)))
    slow, fast = kind(CONFIGS[config]()), kind(CONFIGS[config]())
    expected = [event_key(e) for s in rows for e in slow.check(s)]
    events, _ = _fast(fast, rows, random.Random(shape))
    assert [event_key(e) for e in events] == expected
    assert fast.state_dict() == slow.state_dict()


@pytest.mark.parametrize("kind", FAST, ids=lambda t: t.kind)
def test_a_calm_series_is_mostly_skipped(kind: type[Detector]) -> None:
    rows = _series("calm", 3000, np.random.default_rng(0))
    _, checked = _fast(kind(DetectorConfig()), rows, random.Random(0))
    assert checked < len(rows) // 10


@pytest.mark.parametrize("window", [1, 2, 3, 10])
def test_window_medians_are_those_of_the_windows(window: int) -> None:
    rng = np.random.default_rng(window)
    history, values = rng.normal(size=window + 3), rng.normal(size=50)
    seen = [*history, *values]
    at = len(history)
    before = [float(np.median(seen[at + i - window:at + i])) for i in range(len(values))]
    upto = [float(np.median(seen[at + i + 1 - window:at + i + 1])) for i in range(len(values))]
    assert window_medians(history, values, window, including=False).tolist() == before
    assert window_medians(history, values, window, including=True).tolist() == upto
