"""`nonfinite_metric` on synthetic trainer metrics."""

from __future__ import annotations

import math
from typing import Any

from tests.detect.synth import default_config, signals
from trainguard.detect.nonfinite_metric import NonFiniteMetric


def _run(rows: list[dict[str, float]], loss: float = 0.5) -> list[Any]:
    detector = NonFiniteMetric(default_config())
    return [e for i, row in enumerate(rows)
            for e in detector.check(signals(i, loss=loss, trainer_metrics=row))]


def test_nan_logps_under_a_finite_loss() -> None:
    rows = [{"logps/chosen": -3.0, "rewards/margins": 0.1}] * 2 + [
        {"logps/chosen": math.nan, "rewards/margins": math.nan}] * 3 + [
        {"logps/chosen": -3.0, "rewards/margins": 0.1}, {"logps/chosen": math.inf}]
    found = _run(rows)
    assert [(e.step, e.severity, e.details["metrics"]) for e in found] == [
        (2, "error", ["logps/chosen", "rewards/margins"]), (6, "error", ["logps/chosen"])]


def test_bookkeeping_left_nan_by_design_is_not_judged() -> None:
    rows = [{"completions/mean_terminated_length": math.nan, "clip_ratio/low_min": math.nan,
             "sampling/importance_sampling_ratio/min": math.nan, "reward": 0.2}] * 5
    assert _run(rows) == []


def test_a_nan_loss_is_told_by_its_own_event() -> None:
    assert _run([{"reward": math.nan}], loss=math.nan) == []
