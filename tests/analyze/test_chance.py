"""The loss against chance level (`trainguard.analyze.chance`)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainguard.analyze import analyze
from trainguard.analyze.chance import always_above_any_chance, is_classification_loss


@pytest.mark.parametrize("name, says", [
    ("loss_cls", True), ("s0.loss_cls", True), ("loss_rpn_cls", True), ("cls_loss", True),
    ("CELoss", True), ("loss_ce", True), ("xent", True), ("categorical_cross_entropy", True),
    ("loss", False), ("loss_bbox", False), ("acc_cls", False), ("dice_loss", False),
    ("face_loss", False), ("val_loss_cls", False), ("nll_loss", False),
])
def test_a_classification_loss_is_known_by_the_name_the_log_gives_it(name: str,
                                                                      says: bool) -> None:
    assert is_classification_loss(name) is says


@pytest.mark.parametrize("values, above", [
    ([42030.6, 6671.9], True),      # worse than any uniform guess on both rows
    ([486.0, 43.7, 20.1], True),
    ([486.0, 43.7, 9.0], False),    # came down to where a classifier can start
    ([40.0], False),                # one row says nothing of where it goes
    ([40.0, math.nan], False),
    ([4.4, 3.9, 3.2], False),
])
def test_above_any_chance_level_on_every_row(values: list[float], above: bool) -> None:
    assert always_above_any_chance(values) is above


def _detector_log(rows: list[tuple[int, float, float, float]]) -> str:
    """MMDetection 2.x logger lines (open-mmlab/mmdetection#3446): the RPN's and a cascade
    stage's classification losses beside the total and the gradient norm."""
    return "".join(
        f"2020-07-31 22:40:50,985 - mmdet - INFO - Epoch [1][{it}/1749]\tlr: 1.978e-03, eta: "
        f"2:36:29, time: 1.807, data_time: 0.047, memory: 5280, loss_rpn_cls: {rpn:.4f}, "
        f"loss_rpn_bbox: 13.2660, s0.loss_cls: {cls:.4f}, s0.acc: 97.9023, s0.loss_bbox: "
        f"1.2454, loss: {rpn + cls + 14.5:.4f}, grad_norm: {grad:.4f}\n"
        for it, rpn, cls, grad in rows)


def test_a_classification_loss_above_any_chance_on_every_row_is_an_explosion_from_the_first(
        tmp_path: Path) -> None:
    path = tmp_path / "detectors.log"
    path.write_text(_detector_log([(50, 42030.6, 486.0, 3.8e12), (100, 6671.9, 43.7, 4.1e10)]))
    result = analyze(path)
    assert (result.verdict, result.kind, result.onset) == ("degraded", "explosion",
                                                           "epoch 1, batch 50")
    assert "loss_above_chance" in {e.kind for e in result.events}


def test_a_high_first_classification_loss_that_comes_down_below_chance_is_no_blow_up(
        tmp_path: Path) -> None:
    path = tmp_path / "detectors.log"
    path.write_text(_detector_log([(50, 30.0, 20.0, 40.0), (100, 2.1, 3.5, 12.0),
                                   (150, 0.9, 2.2, 9.0), (200, 0.7, 1.9, 8.5)]))
    result = analyze(path)
    assert "loss_above_chance" not in {e.kind for e in result.events}


def _caffe(totals: list[float], aux: list[float]) -> str:
    lines = []
    for i, (total, term) in enumerate(zip(totals, aux, strict=True)):
        lines += [f"I1010 16:55:58.493882 142934 solver.cpp:229] Iteration {20 * i}, "
                  f"loss = {total}",
                  f"I1010 16:55:58.493966 142934 solver.cpp:245]     Train net output #1: "
                  f"loss_aux = {term} (* 0.4 = {0.4 * term:.4f} loss)",
                  f"I1010 16:55:58.494001 142934 sgd_solver.cpp:106] Iteration {20 * i}, "
                  "lr = 0.0001"]
    return "\n".join(lines) + "\n"


def test_a_loss_term_saturated_at_float32s_floor_is_a_blow_up(tmp_path: Path) -> None:
    path = tmp_path / "train.log"  # Caffe's SoftmaxWithLoss stops at -ln(FLT_MIN) = 87.3365
    path.write_text(_caffe([92.0984, 122.271, 122.271, 122.271, 122.271],
                           [11.9047, 87.3365, 87.3365, 87.3365, 87.3365]))
    result = analyze(path)
    assert result.verdict == "degraded" and result.kind == "explosion"
    assert result.onset == "iteration 20"  # the term's first saturated row, not the total's


def test_a_loss_that_passes_the_saturated_value_once_is_not_one(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text(_caffe([1.2, 1.1, 1.0, 0.95, 0.9], [90.1, 87.3365, 60.2, 30.5, 12.0]))
    assert "loss_above_chance" not in {e.kind for e in analyze(path).events}


def test_a_loss_that_passes_87_34_on_its_way_down_is_no_saturation(tmp_path: Path) -> None:
    path = tmp_path / "train.log"  # two rows at 87.3365 by chance, then lower: no saturation
    values = [95.1, 91.2, 89.0, 88.1, 87.7, 87.3365, 87.3365, 87.1, 86.9, 86.5, 86.2, 85.9]
    path.write_text("".join(f"iter {i} loss {v}\n" for i, v in enumerate(values)))
    result = analyze(path)
    assert "loss_above_chance" not in {e.kind for e in result.events}
    assert result.verdict == "healthy"
