"""The Ultralytics YOLO and YOLOv5 training console (`analyze/yolo.py`), written as a log file
keeps it: every update of the epoch's progress line, split at carriage returns."""

from __future__ import annotations

import math
from pathlib import Path

from trainguard.analyze import analyze, read_log

V8_HEADER = ("      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size")
V5_HEADER = "     Epoch   gpu_mem       box       obj       cls    labels  img_size"


def _console(header: str, terms: list[list[float]], first: int, batches: int = 4) -> str:
    """One header and one progress line per update, each epoch's last update at 100%."""
    out = []
    for epoch, values in enumerate(terms, start=first):
        updates = []
        for batch in range(1, batches + 1):
            shown = [v * (1.2 - 0.2 * batch / batches) for v in values]  # a running mean
            cells = "".join(f"{v:>11.4g}" for v in shown)
            updates.append(f"{epoch:>7}/{len(terms)}      2.61G{cells}         32        640: "
                           f"{100 * batch // batches:3d}%|####| {batch}/{batches} "
                           "[00:10<00:00,  4.80it/s]")
        out.append(header)
        out.append("\r".join(updates))
        out.append("                 Class     Images  Instances      Box(P          R      "
                   "mAP50  mAP50-95): 100%|####| 5/5 [00:01<00:00,  4.00it/s]")
        out.append("                   all        100        300      0.512      0.456      "
                   "0.478      0.301")
    return "\n".join(out) + "\n"


def _terms(epochs: int, nan_at: int | None = None) -> list[list[float]]:
    rows = [[1.5 - 0.02 * e, 2.0 - 0.03 * e, 1.2 - 0.01 * e] for e in range(epochs)]
    if nan_at is not None:
        rows[nan_at][1] = math.nan
    return rows


def test_each_epoch_is_its_last_update_and_the_loss_is_the_sum_of_the_terms(
        tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text(_console(V8_HEADER, _terms(12), first=1))
    log = read_log(path)
    assert log.format == "text:yolo" and log.steps == list(range(1, 13))
    assert log.label(0) == "epoch 1" and log.step_unit == "epoch"
    assert math.isclose(log.values("loss")[0], 1.5 + 2.0 + 1.2, rel_tol=1e-4)
    assert math.isclose(log.values("cls_loss")[11], 2.0 - 0.33, rel_tol=1e-4)


def test_a_term_gone_nan_is_the_loss_gone_nan_at_its_epoch(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text(_console(V5_HEADER, _terms(15, nan_at=9), first=0))
    result = analyze(path)
    assert result.log is not None and result.log.steps == list(range(15))
    assert "box_loss, obj_loss, cls_loss" in result.notes[0]
    assert (result.verdict, result.kind, result.onset) == ("recovered", "nan", "epoch 9")
