"""Keras's `History.history` printed or saved (`analyze/history.py`): one list per metric, one
value per epoch, as people paste it (`print(history.history)`), often cut off."""

from __future__ import annotations

import json
import math
import pprint
from pathlib import Path

import pytest

from trainguard.analyze import analyze, read_log
from trainguard.analyze.log import LogError

EPOCHS = 12


def _history(loss: list[float] | None = None) -> dict[str, list[float]]:
    loss = loss or [round(0.9 * math.exp(-i / 5) + 0.05, 4) for i in range(EPOCHS)]
    return {"loss": loss, "accuracy": [round(0.5 + 0.04 * i, 4) for i in range(len(loss))],
            "val_loss": [round(v + 0.03, 4) for v in loss],
            "val_accuracy": [round(0.48 + 0.04 * i, 4) for i in range(len(loss))]}


def test_a_printed_history_is_read_epoch_by_epoch(tmp_path: Path) -> None:
    history = _history()
    path = tmp_path / "cell_output.txt"
    path.write_text(f"Epoch 12/12\n{history}\n")  # `print(history.history)`, single quotes
    log = read_log(path)
    assert log.format == "text:history" and log.step_unit == "epoch"
    assert log.steps == list(range(1, EPOCHS + 1)) and log.label(0) == "epoch 1"
    assert log.values("loss") == history["loss"]
    assert log.values("accuracy")[-1] == history["accuracy"][-1]
    assert log.evals[0][1]["val_loss"] == history["val_loss"][0]
    assert analyze(path).verdict == "healthy"


def test_a_saved_or_pretty_printed_history_is_read_too(tmp_path: Path) -> None:
    history = _history()
    saved = tmp_path / "history.json"
    saved.write_text(json.dumps(history, indent=2))
    pretty = tmp_path / "pasted.txt"
    pretty.write_text("history:\n" + pprint.pformat(history, width=60) + "\n")
    for path in (saved, pretty):
        log = read_log(path)
        assert log.format == "text:history", path
        assert log.values("loss") == history["loss"], path


def test_a_copy_cut_off_inside_a_list_keeps_the_values_before_the_cut(tmp_path: Path) -> None:
    history = _history()
    text = str(history)
    third = str(history["val_loss"][2])
    cut = text.index(third, text.index("'val_loss': [")) + len(third) - 2
    path = tmp_path / "issue.txt"
    path.write_text(text[:cut])  # the copy ends inside `val_loss`'s third number
    log = read_log(path)
    assert log.values("loss") == history["loss"]
    evals = [metrics["val_loss"] for _, metrics in log.evals if "val_loss" in metrics]
    assert evals == history["val_loss"][:2]  # the third, maybe cut short, is left out


def test_a_nan_in_the_loss_list_is_the_run_going_nan(tmp_path: Path) -> None:
    loss = [0.9, 0.7, 0.6, 0.55, 0.5, float("nan"), float("nan"), float("nan")]
    path = tmp_path / "cell_output.txt"
    path.write_text(str(_history(loss)) + "\n")
    result = analyze(path)
    assert result.verdict == "degraded" and result.kind == "nan", result.evidence
    assert result.onset == "epoch 6"


def test_a_dict_of_lists_without_a_loss_is_not_a_history(tmp_path: Path) -> None:
    path = tmp_path / "config.txt"
    path.write_text("{'layers': [64, 64, 32], 'dropout': [0.1, 0.2]}\n")
    with pytest.raises(LogError, match="no training log lines recognised"):
        read_log(path)


def test_a_history_printed_as_it_grows_is_read_at_its_last_print(tmp_path: Path) -> None:
    """A loop that prints its growing history after every fit: the last print is the run."""
    loss = [round(0.9 - 0.01 * i, 3) for i in range(24)] + [float("nan")] * 6
    text = "".join(f"{ {'loss': loss[:n], 'accuracy': [0.5] * n} }\n" for n in (2, 10, 30))
    path = tmp_path / "cell_output.txt"
    path.write_text(text)
    log = read_log(path)
    assert len(log.steps) == 30 and "last print" in " ".join(log.notes)
    assert analyze(path).kind == "nan"


def test_a_history_dict_above_a_console_leaves_the_console_its_rows(tmp_path: Path) -> None:
    """One short history printed at the top of a Keras console of 30 epochs: the console's rows
    are the log (its NaN from epoch 22 is not hidden behind the dict's four epochs)."""
    lines = [str({"loss": [0.9, 0.8, 0.7, 0.6]})]
    for epoch in range(1, 31):
        loss = "nan" if epoch >= 22 else f"{1.0 - 0.02 * epoch:.4f}"
        lines += [f"Epoch {epoch}/30", f"100/100 [====] - 1s - loss: {loss} - acc: 0.71"]
    path = tmp_path / "console.txt"
    path.write_text("\n".join(lines) + "\n")
    result = analyze(path)
    assert result.log.format == "text:generic"
    assert (result.verdict, result.kind) == ("degraded", "nan")
