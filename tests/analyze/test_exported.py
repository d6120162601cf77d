"""A chart's values as TensorBoard and W&B export them (`analyze/exported.py`), in files written
as their web pages write them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainguard.analyze import analyze, read_log
from trainguard.analyze.log import LogError


def _losses(count: int = 40, nan_at: int | None = None) -> list[float]:
    values = [2.5 * math.exp(-i / 15) + 0.3 for i in range(count)]
    if nan_at is not None:
        values[nan_at] = math.nan
    return values


def _tensorboard(path: Path, values: list[float]) -> Path:
    path.write_text("Wall time,Step,Value\n" + "".join(
        f"{1.7e9 + 10 * i},{100 * (i + 1)},{value}\n" for i, value in enumerate(values)))
    return path


def test_a_tensorboard_download_is_read_under_the_tag_of_its_name(tmp_path: Path) -> None:
    result = analyze(_tensorboard(tmp_path / "run-version_0-tag-train_loss.csv",
                                  _losses(nan_at=30)))
    log = result.log
    assert log is not None and log.format == "tensorboard-csv"
    assert log.steps == [100 * (i + 1) for i in range(40)]
    assert (result.verdict, result.kind, result.onset) == ("recovered", "nan", "step 3100")
    assert "one scalar, 'train_loss' (from the file's name)" in log.notes


def test_an_evaluation_loss_alone_is_judged_and_said_so(tmp_path: Path) -> None:
    log = read_log(_tensorboard(tmp_path / "run-.-tag-val_loss.csv", _losses()))
    assert log.values("loss")[:2] == _losses()[:2] and log.loss_is_evaluation
    assert any("its evaluation loss 'val_loss' is judged" in note for note in log.notes)


def test_an_evaluation_metric_alone_is_one_clear_error(tmp_path: Path) -> None:
    path = _tensorboard(tmp_path / "run-.-tag-val_accuracy.csv", [0.5] * 10)
    with pytest.raises(LogError, match=r"evaluation values only \(val_accuracy\)"):
        read_log(path)


def _wandb(path: Path, runs: list[str], values: list[float]) -> Path:
    names = [f"{run} - {metric}{suffix}" for run in runs for metric in ("train/loss",)
             for suffix in ("", "__MIN", "__MAX")]
    lines = [",".join(f'"{name}"' for name in ["Step", *names])]
    for i, value in enumerate(values):
        cells = [str(10 * (i + 1))] + [("" if i % 7 == 3 and r else repr(value * (1 + r)))
                                       for r in range(len(runs)) for _ in range(3)]
        lines.append(",".join(f'"{cell}"' for cell in cells))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_wandb_panel_export_is_read_on_its_first_run(tmp_path: Path) -> None:
    path = _wandb(tmp_path / "wandb_export_2024-05-01T12_00_00.csv",
                  ["lora-r16-lr2e-4", "lora-r16-lr1e-3"], _losses(nan_at=25))
    result = analyze(path)
    log = result.log
    assert log is not None and log.format == "wandb-csv"
    assert log.steps == [10 * (i + 1) for i in range(40)]
    assert sorted(log.series) == ["loss"], "the first run's, without the envelope"
    assert "2 runs' curves in the file: the first, 'lora-r16-lr2e-4', is read" in log.notes
    assert (result.verdict, result.kind, result.onset) == ("recovered", "nan", "step 260")


def test_a_row_that_is_not_a_step_and_its_values_is_one_clear_error(tmp_path: Path) -> None:
    path = _wandb(tmp_path / "export.csv", ["run"], _losses(10))
    path.write_text(path.read_text() + '"x","1","1","1"\n')
    with pytest.raises(LogError, match="line 12 is not a step"):
        read_log(path)
