"""A metric's own headerless CSV, `epoch,step,value` a line (`analyze/metric_csv.py`), as d3rlpy
writes `critic_loss.csv` and its other metrics."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainguard.analyze import analyze_log, read_log


def _write(path: Path, values: list[float]) -> Path:
    path.write_text("".join(f"{i + 1},{1000 * (i + 1)},{v!r}\n" for i, v in enumerate(values)))
    return path


def test_a_loss_file_is_the_loss_at_its_steps(tmp_path: Path) -> None:
    values = [2.0 * math.exp(-i / 30) + 0.1 for i in range(120)]
    log = read_log(_write(tmp_path / "critic_loss.csv", values))
    assert log.format == "metric-csv" and log.steps[:2] == [1000, 2000]
    assert log.label(1) == "epoch 2, step 2000"
    assert log.series["loss"][5] == pytest.approx(values[5])
    assert analyze_log(log).verdict == "healthy"


def test_a_loss_that_turns_nan_is_told_at_its_step(tmp_path: Path) -> None:
    values = [2.0 * math.exp(-i / 30) + 0.1 for i in range(60)] + [math.nan] * 20
    result = analyze_log(read_log(_write(tmp_path / "actor_loss.csv", values)))
    assert result.verdict == "degraded" and result.kind == "nan"
    assert result.onset == "epoch 61, step 61000"


def test_another_metric_keeps_its_name(tmp_path: Path) -> None:
    log = read_log(_write(tmp_path / "environment.csv", [float(i) for i in range(20)]))
    assert "environment" in log.series and "loss" not in log.series
