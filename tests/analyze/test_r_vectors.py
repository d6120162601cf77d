"""R's printed numeric vectors (`analyze/r_vectors.py`): keras for R's `history$metrics`, mxnet's
metric logger, a loop's own vector, as R prints them (`[1] v v v`, `[9] v ...`)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainguard.analyze import analyze, read_log
from trainguard.analyze.log import LogError


def r_print(values: list[float], per_line: int = 8) -> str:
    """A numeric vector as R prints it: each line led by its first value's position."""
    lines = []
    for start in range(0, len(values), per_line):
        chunk = " ".join(f"{v:.6g}" for v in values[start:start + per_line])
        position = f"[{start + 1}]"
        lines.append(f"{position:>{len(str(len(values))) + 2}} {chunk}")  # ` [1]`, `[17]`
    return "\n".join(lines)


def test_keras_for_r_metrics_are_read_epoch_by_epoch(tmp_path: Path) -> None:
    loss = [round(0.9 * math.exp(-i / 6) + 0.05, 5) for i in range(20)]
    val = [round(v + 0.04, 5) for v in loss]
    path = tmp_path / "console.txt"
    path.write_text(f"> history$metrics\n$loss\n{r_print(loss)}\n\n$val_loss\n{r_print(val)}\n")
    log = read_log(path)
    assert log.format == "text:rvector" and log.step_unit == "epoch"
    assert log.steps == list(range(1, 21)) and log.values("loss") == loss
    assert log.evals[0] == (1, {"val_loss": val[0]})
    assert analyze(path).verdict == "healthy"


def test_mxnets_logger_train_vector_is_the_loss_and_said_so(tmp_path: Path) -> None:
    """`mx.metric.logger`: `log$train` and `log$eval`, pasted with a markdown backtick left."""
    train = [round(0.3 * math.exp(-i / 4) + 0.01, 6) for i in range(12)]
    path = tmp_path / "issue.txt"
    path.write_text(f"> log$train\n{r_print(train)}`\n> log$eval\n"
                    f"{r_print([v * 1.1 for v in train])}\n")
    log = read_log(path)
    assert log.values("loss") == train and "mxnet" in log.notes[0]
    assert log.evals[-1][1]["eval"] == pytest.approx(train[-1] * 1.1, rel=1e-5)


def test_a_vector_printed_again_is_read_at_its_last_print(tmp_path: Path) -> None:
    first, second = [1.0, 0.9, 0.8], [1.0, 0.9, 0.8, 0.7, 0.6, math.nan]
    path = tmp_path / "console.txt"
    path.write_text(f"> losses\n{r_print(first)}\n> losses\n{r_print(second, per_line=4)}\n")
    result = analyze(path)
    assert read_log(path).values("loss")[:5] == second[:5]
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "epoch 6")


@pytest.mark.parametrize("text", [
    "> log$train\n[1] 0.5\n",                       # one value: no curve
    "> accuracy\n[1] 0.5 0.6 0.7 0.8\n",           # no loss among the names
    "> losses\n[1] 0.5 0.4 0.3\n[9] 0.2 0.1\n",    # positions that skip: not one vector
    "[1] 0.5 0.4 0.3 0.2\n",                        # no name
])
def test_vectors_that_hold_no_loss_curve_are_not_read(tmp_path: Path, text: str) -> None:
    path = tmp_path / "console.txt"
    path.write_text(text)
    with pytest.raises(LogError):
        read_log(path)


def test_na_is_a_missing_value_and_nested_headings_name_the_vector(tmp_path: Path) -> None:
    """`print(unclass(history))` heads each vector with its whole path (`$metrics$loss`); `NA`
    is an epoch without a value."""
    loss = [round(0.9 * 0.9 ** i, 4) for i in range(12)]
    printed = r_print(loss).replace(f"{loss[4]:.6g}", "NA")
    path = tmp_path / "console.txt"
    path.write_text(f"> unclass(history)\n$params$epochs\n[1] 12\n\n$metrics$loss\n{printed}\n")
    log = read_log(path)
    assert log.values("loss") == [*loss[:4], *loss[5:]] and 5 not in log.steps


def test_mxnets_train_vector_that_rises_is_an_accuracy_not_a_loss(tmp_path: Path) -> None:
    """mxnet's logger keeps whatever metric the run names (`mx.metric.accuracy` in its
    tutorials): a `train` vector that rises is no loss, and is not read as one."""
    path = tmp_path / "console.txt"
    path.write_text(f"> logger$train\n{r_print([0.5 + 0.04 * i for i in range(12)])}\n")
    with pytest.raises(LogError):
        read_log(path)


def test_a_long_run_of_digits_is_read_in_linear_time(tmp_path: Path) -> None:
    """Each value matches one way: a 100k-digit token is passed over at once (a pattern that
    splits a run of digits in as many ways as it has digits took minutes)."""
    path = tmp_path / "console.txt"
    path.write_text("[1] " + "1" * 100_000 + "x\n> losses\n[1] 0.5 0.4 0.3\n")
    assert read_log(path).values("loss") == [0.5, 0.4, 0.3]
