"""The Keras `CSVLogger` reader: a file shaped as Keras writes it, read and judged."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainguard.analyze import analyze, read_log
from trainguard.analyze.log import LogError

HEADER = "epoch,accuracy,loss,lr,val_accuracy,val_loss\n"


def _csv_logger(path: Path, losses: list[float], lr: float = 0.001) -> Path:
    lines = [HEADER]
    for epoch, loss in enumerate(losses):
        lines.append(f"{epoch},{0.5 + epoch / 100},{loss},{lr},{0.5 + epoch / 120},"
                     f"{loss * 1.1}\n")
    path.write_text("".join(lines))
    return path


def test_a_csv_logger_file_is_read_by_epoch_whatever_its_name(tmp_path: Path) -> None:
    log = read_log(_csv_logger(tmp_path / "training.log", [0.9, 0.7, 0.6, 0.55]))
    assert log.format == "keras"
    assert log.steps == [0, 1, 2, 3]
    assert log.values("loss") == [0.9, 0.7, 0.6, 0.55]
    assert log.label(2) == "epoch 2"
    assert [step for step, _ in log.evals] == [0, 1, 2, 3]
    assert log.evals[0][1]["val_loss"] == pytest.approx(0.99)


def test_a_csv_logger_file_named_csv_is_not_taken_for_lightning(tmp_path: Path) -> None:
    assert read_log(_csv_logger(tmp_path / "history.csv", [0.9, 0.8])).format == "keras"


def test_a_nan_epoch_is_the_onset_named_as_keras_counts(tmp_path: Path) -> None:
    path = _csv_logger(tmp_path / "training.log", [0.9, 0.7, 0.6, math.nan, math.nan])
    result = analyze(path)
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "epoch 3")


def test_a_healthy_run_with_lr_reductions_is_healthy(tmp_path: Path) -> None:
    losses = [0.056 * 0.93 ** epoch for epoch in range(24)]
    assert analyze(_csv_logger(tmp_path / "training.log", losses)).verdict == "healthy"


def test_a_header_without_epoch_first_is_refused_when_forced(tmp_path: Path) -> None:
    path = tmp_path / "other.log"
    path.write_text("loss,epoch\n0.5,0\n")
    with pytest.raises(LogError, match="not a Keras CSVLogger"):
        read_log(path, "keras")


def test_the_summary_says_the_log_was_written_every_epoch(tmp_path: Path) -> None:
    from trainguard.analyze.summary import summary_lines

    lines = summary_lines(analyze(_csv_logger(tmp_path / "training.log", [0.9, 0.7, 0.6, 0.55])))
    assert "every epoch)" in lines[0] and "every step" not in lines[0]
