"""A log of several runs (cross-validation folds, a model retrained per setting) is judged run by
run: a fresh model's first losses at each new start are no explosion, and trouble inside one run
is still told, in the log's own words; a resume or two runs' lines interleaved stay one log."""

from __future__ import annotations

import math
from pathlib import Path

from trainguard.analyze import analyze
from trainguard.analyze.formats import read_log
from trainguard.analyze.runs import run_starts

EPOCHS = 40


def _fold(seed: int, nan_from: int | None = None) -> list[float]:
    """A regression's epoch losses: from about 14 down to about 1, a little noise."""
    out = []
    for epoch in range(1, EPOCHS + 1):
        loss = 1.0 + 13.0 * math.exp(-epoch / 4) + 0.05 * math.sin(3 * epoch + seed)
        out.append(math.nan if nan_from is not None and epoch >= nan_from else loss)
    return out


def _keras(path: Path, folds: list[list[float]], first_epoch: int = 1) -> Path:
    """Keras `fit` output, one `fit` call after another, as a notebook cell holds it."""
    lines = []
    for losses in folds:
        for epoch, loss in enumerate(losses, first_epoch):
            lines.append(f"Epoch {epoch}/{len(losses) + first_epoch - 1}")
            lines.append(f"726/726 [==============================] - 0s 57us/step - loss: "
                         f"{loss:.4f}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_five_folds_are_five_healthy_runs_not_four_explosions(tmp_path: Path) -> None:
    path = _keras(tmp_path / "cell_output.txt", [_fold(k) for k in range(5)])
    assert run_starts(read_log(path)) == [EPOCHS * k for k in range(1, 5)]
    result = analyze(path)
    assert result.verdict == "healthy" and result.onset is None and not result.causes
    assert "5 runs" in result.evidence[0] and "each, judged from its own start" in \
        result.evidence[0]


def test_trouble_in_one_run_is_told_at_its_row(tmp_path: Path) -> None:
    folds = [_fold(0), _fold(1), _fold(2, nan_from=25), _fold(3)]
    result = analyze(_keras(tmp_path / "cell_output.txt", folds))
    assert result.verdict == "degraded" and result.kind == "nan"
    assert result.onset == f"row {2 * EPOCHS + 25} (epoch 25)"
    assert any("run 3" in note for note in result.notes)


def test_a_resume_from_a_later_point_is_the_same_run(tmp_path: Path) -> None:
    # epochs 1-40, then again from epoch 21 (a checkpoint), a jump where it resumed
    resumed = [v * 3 for v in _fold(1)[20:]]
    path = _keras(tmp_path / "a.txt", [_fold(0)])
    with path.open("a") as handle:
        for epoch, loss in enumerate(resumed, 21):
            handle.write(f"Epoch {epoch}/{EPOCHS}\n726/726 [====] - 0s 57us/step - loss: "
                         f"{loss:.4f}\n")
    assert run_starts(read_log(path)) == []


def test_short_runs_or_lines_of_two_runs_in_turn_stay_one_log(tmp_path: Path) -> None:
    short = _keras(tmp_path / "short.txt", [_fold(k)[:5] for k in range(6)])
    assert run_starts(read_log(short)) == []
    interleaved = tmp_path / "interleaved.txt"
    lines = []
    for epoch in range(1, EPOCHS + 1):
        for run in range(2):
            lines += [f"Epoch {epoch}/{EPOCHS}",
                      f"726/726 [====] - 0s 57us/step - loss: {_fold(run)[epoch - 1]:.4f}"]
    interleaved.write_text("\n".join(lines) + "\n")
    assert run_starts(read_log(interleaved)) == []
