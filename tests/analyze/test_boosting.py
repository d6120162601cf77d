"""The consoles of CatBoost, XGBoost and LightGBM (`analyze/boosting.py`), as a notebook's cell
output or a log file keeps them."""

from __future__ import annotations

import math
from pathlib import Path

from trainguard.analyze import analyze, read_log


def _catboost(learn: list[float], test: list[float], *, higher: bool = False) -> str:
    lines = ["Learning rate set to 0.5"]
    best = None
    for i, (a, b) in enumerate(zip(learn, test, strict=True)):
        best = b if best is None else (max(best, b) if higher else min(best, b))
        lines.append(f"{i}:\tlearn: {a:.7f}\ttest: {b:.7f}\tbest: {best:.7f} ({i})\t"
                     f"total: {3 * i + 3}ms\tremaining: {30 - i}ms")
    return "\n".join([*lines, "", f"bestTest = {best:.7f}", "bestIteration = 9", ""]) + "\n"


def test_catboost_learn_is_the_loss_and_test_an_evaluation(tmp_path: Path) -> None:
    path = tmp_path / "cell_output.txt"
    learn = [128.66 - 0.9 * i for i in range(12)]
    path.write_text(_catboost(learn, [140.6 + (0.2 if i in (2, 3) else -0.1 * i)
                                      for i in range(12)]))
    log = read_log(path)
    assert log.format == "text:boosting" and log.steps == list(range(12))
    assert log.label(0) == "iteration 0" and log.step_unit == "iteration"
    assert math.isclose(log.values("loss")[11], learn[11], rel_tol=1e-6)
    assert "eval_loss" in log.evals[0][1]
    assert analyze(path).verdict == "healthy"


def test_a_catboost_score_whose_best_is_its_running_maximum_is_no_loss(tmp_path: Path) -> None:
    path = tmp_path / "cell_output.txt"
    rising = [0.40 + 0.01 * i for i in range(10)]
    path.write_text(_catboost(rising, [0.41 + 0.01 * i for i in range(10)], higher=True))
    log = read_log(path)
    assert "loss" not in log.series and log.values("score")[9] == rising[9]
    assert "score" in log.notes[0]
    assert analyze(path).verdict == "healthy"  # an accuracy that rises is no divergence


def test_xgboost_pairs_name_the_loss_and_a_nan_is_the_loss_gone_nan(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    rows = []
    for i in range(30):
        train = math.nan if i >= 20 else 17.0 * 0.9 ** i
        rows.append(f"[{i}]\ttrain-rmse:{train:.5f}\ttrain-auc:0.{60 + i}\t"
                    f"eval-rmse:{17.2 * 0.9 ** i:.5f}")
    path.write_text("\n".join(rows) + "\n")
    log = read_log(path)
    assert log.format == "text:boosting"
    assert set(log.series) >= {"loss", "auc"} and "eval_loss" in log.evals[0][1]
    result = analyze(path)
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "iteration 20")


def test_lightgbm_sets_and_the_best_iteration_repeated_after_early_stopping(
        tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    lines = ["[LightGBM] [Info] Total Bins 1234"]
    for i in range(1, 21):
        lines.append(f"[{i}]\ttraining's binary_logloss: {0.69 * 0.95 ** i:.6f}\t"
                     f"valid_1's binary_logloss: {0.69 * 0.96 ** i:.6f}\t"
                     f"valid_1's auc: {0.70 + 0.01 * i:.4f}\t"
                     f"valid_2's binary_logloss: {0.7 * 0.97 ** i:.6f}")
    lines += ["Early stopping, best iteration is:", lines[15]]
    path.write_text("\n".join(lines) + "\n")
    log = read_log(path)
    assert log.steps == list(range(1, 21))  # the repeated line is no 21st row
    assert math.isclose(log.values("loss")[0], 0.69 * 0.95, rel_tol=1e-5)
    evaluation = log.evals[0][1]
    assert {"eval_valid_1_loss", "eval_valid_1_auc", "eval_valid_2_loss"} <= set(evaluation)
    assert analyze(path).verdict == "healthy"


def test_evaluation_sets_only_judge_the_first_one_and_say_so(tmp_path: Path) -> None:
    """XGBoost's scikit-learn API names every set `validation_N`, the training data included."""
    path = tmp_path / "fit.log"
    rows = [f"[{i}]\tvalidation_0-logloss:{0.6 * 0.9 ** i:.5f}\t"
            f"validation_1-logloss:{0.62 * 0.92 ** i:.5f}" for i in range(15)]
    rows += [f"[{i}]\tvalidation_0-logloss:nan\tvalidation_1-logloss:nan" for i in range(15, 20)]
    path.write_text("\n".join(rows) + "\n")
    log = read_log(path)
    assert log.loss_is_evaluation and "first one's values are judged" in log.notes[0]
    assert math.isclose(log.values("loss")[1], 0.54, rel_tol=1e-4)
    assert "eval_validation_1_loss" in log.evals[0][1]
    result = analyze(path)
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "iteration 15")
    scores = tmp_path / "auc.log"
    scores.write_text("".join(f"[{i}]\tvalidation_0-auc:0.9{i}\tvalidation_1-auc:0.8{i}\n"
                              for i in range(8)))
    assert "no loss among them" in read_log(scores).notes[0]


def test_a_training_set_of_scores_only_is_said_to_hold_no_loss(tmp_path: Path) -> None:
    """`[0] train-auc:0.9 eval-auc:0.8`: the training set's AUC is no loss, and the note says
    so; a first line without the training set reads no worse."""
    path = tmp_path / "auc.log"
    rows = ["[0]\teval-auc:0.70000"] + [f"[{i}]\ttrain-auc:0.{80 + i}\teval-auc:0.{70 + i}"
                                        for i in range(1, 10)]
    path.write_text("\n".join(rows) + "\n")
    log = read_log(path)
    assert "loss" not in log.series and "scores only" in log.notes[0]
