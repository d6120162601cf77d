"""A log without a loss judged on its quality metrics (`trainguard.analyze.scores`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.analyze import analyze
from trainguard.analyze.analysis import analyze_log
from trainguard.analyze.log import Log
from trainguard.analyze.scores import judged_metrics


def _log(series: dict[str, list[float | None]]) -> Log:
    rows = len(next(iter(series.values())))
    return Log(path="evals.txt", format="text:generic", steps=list(range(1, rows + 1)),
               series=series, step_unit="epoch")


@pytest.mark.parametrize("series, verdict, kind, onset", [
    # an accuracy that falls off a cliff in one evaluation and stays there
    ({"val_accuracy": [0.20, 0.40, 0.55, 0.61, 0.02, 0.01, 0.01]}, "degraded", "explosion", 5),
    # the same, slid to it over several evaluations
    ({"val_accuracy": [0.5, 0.6, 0.62, 0.45, 0.38, 0.29, 0.2]}, "degraded", "slow-divergence", 6),
    # a drop below half its best that comes back
    ({"mIoU": [60.0, 64.0, 65.0, 12.0, 63.0, 66.0]}, "recovered", "explosion", 4),
    # a lower-is-better metric three times its best, to the end
    ({"val_wer": [0.5, 0.3, 0.2, 0.21, 0.9, 0.95]}, "degraded", "explosion", 5),
    # FID falls as a generator learns: healthy, not a cliff
    ({"fid": [174.0, 90.0, 40.0, 20.0, 9.9]}, "healthy", None, None),
    # a dip that stays within the cliff's bound
    ({"mIoU": [59.0, 62.0, 67.0, 50.0, 66.0]}, "healthy", None, None),
    # an accuracy that creeps up from near chance is not judged on its level
    ({"acc": [8.62, 9.1, 10.5, 11.9, 12.4, 13.97]}, "healthy", None, None),
    # an RL trainer's reward and score are left to the RL rules
    ({"ep_reward": [10.0, 50.0, 80.0, 5.0, 4.0]}, "healthy", None, None),
    # the same value, to every digit, at every evaluation: outputs that never changed
    ({"fid": [646.0821975894278] * 5, "clip": [0.1606282740831375] * 5}, "stalled", None, 1),
    # an accuracy of 1.0 repeated, or a rounded score: a converged run
    ({"val_accuracy": [1.0] * 6}, "healthy", None, None),
    ({"val_accuracy": [0.9375] * 6}, "healthy", None, None),
    # too few evaluations to say the outputs never changed
    ({"fid": [646.0821975894278] * 4}, "healthy", None, None),
    # 29 right of 30 at each evaluation: a small validation set whose predictions settled
    ({"val_acc": [29 / 30] * 6}, "healthy", None, None),
    ({"val_acc": [100 * 29 / 30] * 6}, "healthy", None, None),
    # a small first best is noise, not a level the metric held
    ({"val_mAP": [0.02, 0.008, 0.05, 0.1, 0.2, 0.3, 0.35]}, "healthy", None, None),
    ({"eval_accuracy": [0.03, 0.012, 0.18, 0.4, 0.6, 0.759]}, "healthy", None, None),
    # a training accuracy swings with each batch
    ({"train_acc": [0.5, 0.75, 0.625, 0.875, 0.25, 0.75, 0.875]}, "healthy", None, None),
    ({"acc": [0.5, 0.75, 0.625, 0.875, 0.25, 0.75, 0.875], "lr": [1e-3] * 7},
     "healthy", None, None),
    # an error rate falls as the model learns; an answer's F1 is no word error rate
    ({"top1_err": [90.0, 70.0, 50.0, 40.0, 30.0, 25.0]}, "healthy", None, None),
    ({"answer_f1": [0.1, 0.3, 0.5, 0.6, 0.65]}, "healthy", None, None),
    ({"batch_acc": [0.5, 0.75, 0.625, 0.875, 0.25, 0.75, 0.875]}, "healthy", None, None),
    # values before the model learned anything swing by halves: no level to fall from
    ({"val_mAP": [0.0004, 0.0005, 0.0002, 0.003, 0.02, 0.1, 0.2, 0.3]}, "healthy", None, None),
    # a climb, then a fall that lasts: no level held, but it stays down
    ({"val_acc": [0.1, 0.2, 0.4, 0.8, 0.1, 0.1, 0.1]}, "degraded", "explosion", 5),
    # 29/30 as a float32 gives it, or printed to six digits
    ({"val_acc": [0.9666666388511658] * 6}, "healthy", None, None),
    ({"val_acc": [0.966667] * 6}, "healthy", None, None),
    # an F1 written as a score is judged as an F1
    ({"f1_score": [0.6, 0.7, 0.72, 0.1, 0.1]}, "degraded", "explosion", 4),
])
def test_a_log_without_a_loss_is_judged_on_its_quality_metric(
        series: dict[str, list[float | None]], verdict: str, kind: str | None,
        onset: int | None) -> None:
    result = analyze_log(_log(series))
    assert (result.verdict, result.kind, result.onset_step) == (verdict, kind, onset)


@pytest.mark.parametrize("loss", ["loss", "loss_total", "l_pix"])
def test_a_log_with_a_loss_under_any_name_is_judged_on_the_loss(loss: str) -> None:
    # the accuracy's cliff is the evaluations' rule beside a loss, not this one
    result = analyze_log(_log({loss: [2.0, 1.5, 1.2, 1.1, 1.0, 0.9],
                               "val_accuracy": [0.5, 0.6, 0.7, 0.2, 0.72, 0.75]}))
    assert result.verdict == "healthy"


def test_a_log_of_evaluations_without_rows_is_no_crash() -> None:
    log = Log(path="evals.txt", format="text:generic", steps=[], series={}, step_unit="step",
              evals=[(10, {"eval_accuracy": 0.5}), (20, {"eval_accuracy": 0.1})])
    assert judged_metrics(log) == {}


def test_an_mllog_result_whose_map_collapses_is_degraded_at_its_epoch(tmp_path: Path) -> None:
    """An MLPerf Mask R-CNN result logs only its box and mask mAP: both falling to 0 after
    three good evaluations is where the run broke."""
    lines = [':::MLLOG {"key": "submission_benchmark", "value": "maskrcnn", "metadata": {}}']
    for epoch, (box, mask) in enumerate([(0.1, 0.09), (0.18, 0.17), (0.21, 0.2),
                                         (0.00015, 0.0), (0.0001, 0.0), (0.0002, 0.0)],
                                        start=1):
        lines.append(':::MLLOG {"key": "eval_accuracy", "value": {"BBOX": '
                     f'{box}, "SEGM": {mask}}}, "metadata": {{"epoch_num": {epoch}}}}}')
    path = tmp_path / "result_0.txt"
    path.write_text("\n".join(lines) + "\n")
    result = analyze(path)
    assert (result.verdict, result.kind, result.onset) == ("degraded", "explosion",
                                                            "epoch_num 4")
    assert any("accuracy/bbox fell to 0.00015 from its best 0.21" in line
               for line in result.evidence)
    assert any("shows no recovery" in line for line in result.evidence)


def test_a_generators_fid_log_is_judged_on_fid_not_as_an_rl_run(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    rows = [(1000, 180.2, 3.1), (2000, 95.4, 5.2), (3000, 51.0, 7.9), (4000, 33.8, 9.8),
            (5000, 29.9, 10.4), (6000, 141.7, 3.3), (7000, 160.3, 3.0)]
    path.write_text("step,fid,inception_score\n" + "".join(f"{s},{f},{i}\n" for s, f, i in rows))
    result = analyze(path)
    assert (result.verdict, result.kind, result.onset_step) == ("degraded", "explosion", 6000)
    assert not any("RL" in line for line in result.evidence) and result.causes == []


@pytest.mark.parametrize("accs, verdict, onset", [
    ([0.5, 0.6, 0.65, 0.1, 0.66, 0.7, 0.72], "recovered", 190),  # a dip, back
    ([0.5, 0.6, 0.65, 0.1, 0.1, 0.1, 0.1], "degraded", 190),     # a fall that stays
    ([0.02, 0.008, 0.3, 0.5, 0.6, 0.65, 0.7], "healthy", None),  # noise before it learned
])
def test_a_lightning_csv_of_lr_and_validation_accuracy_is_judged_on_the_accuracy(
        tmp_path: Path, accs: list[float], verdict: str, onset: int | None) -> None:
    """`LearningRateMonitor` and `self.log("val_acc")`, no training loss logged: the LR's rows
    are no level to judge the accuracy's fall from, the accuracy's own best is."""
    lines = ["epoch,step,lr-Adam,val_acc"]
    for epoch, acc in enumerate(accs):
        lines += [f"{epoch},{epoch * 50 + s * 10},0.001," for s in range(5)]
        lines.append(f"{epoch},{epoch * 50 + 49},,{acc}")
    path = tmp_path / "metrics.csv"
    path.write_text("\n".join(lines) + "\n")
    result = analyze(path)
    assert (result.verdict, result.onset_step) == (verdict, onset)
    assert not any("first logged row" in line for line in result.evidence)
