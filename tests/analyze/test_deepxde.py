"""DeepXDE's `loss.dat` (`analyze/deepxde.py`), written as `dde.saveplot` writes it: `np.savetxt`
of the step, the training terms, the test terms and the metrics, under DeepXDE's one header."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from trainguard.analyze import analyze_log, read_log

HEADER = "step, loss_train, loss_test, metrics_test"


def _save(path: Path, steps: np.ndarray, train: np.ndarray, metrics: int) -> Path:
    test = train * 1.1
    columns = [steps[:, None], train, test]
    if metrics:
        columns.append(np.full((len(steps), metrics), 0.05))
    np.savetxt(path, np.hstack(columns), header=HEADER)
    return path


@pytest.mark.parametrize("metrics", [0, 1])
def test_the_loss_is_the_sum_of_the_training_terms(tmp_path: Path, metrics: int) -> None:
    steps = np.arange(0, 30000, 1000, dtype=float)
    train = np.stack([np.exp(-steps / 5000), 0.1 * np.exp(-steps / 8000),
                      0.01 * np.ones_like(steps)], axis=1)
    log = read_log(_save(tmp_path / "loss.dat", steps, train, metrics))
    assert log.format == "text:deepxde" and log.steps[:3] == [0, 1000, 2000]
    assert log.series["loss"][4] == pytest.approx(float(train[4].sum()))
    assert log.series["loss_term_1"][4] == pytest.approx(float(train[4, 1]))
    assert not log.evals  # the test points are more of the same domain, not held-out data
    assert analyze_log(log).verdict == "healthy"


def test_a_term_that_turns_nan_breaks_the_run(tmp_path: Path) -> None:
    steps = np.arange(0, 20000, 1000, dtype=float)
    train = np.stack([np.exp(-steps / 5000), 0.1 * np.exp(-steps / 8000)], axis=1)
    train[12:, 1] = math.nan
    result = analyze_log(read_log(_save(tmp_path / "loss.dat", steps, train, 1)))
    assert result.verdict == "degraded" and result.kind == "nan" and result.onset_step == 12000


def test_numbers_without_deepxdes_header_are_not_read_so(tmp_path: Path) -> None:
    path = tmp_path / "loss.dat"
    np.savetxt(path, np.ones((10, 5)))
    with pytest.raises(Exception, match="no training log lines recognised"):
        read_log(path, "text:deepxde")
