"""MLPerf's `:::MLLOG` event lines (`analyze/mllog.py`), as a training result file holds them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainguard.analyze import analyze, read_log


def _event(key: str, value: object, prefix: str = "", **metadata: object) -> str:
    meta = {"file": "train.py", "lineno": 7, **metadata}
    return prefix + ":::MLLOG " + json.dumps({
        "namespace": "", "time_ms": 1759677925155, "event_type": "POINT_IN_TIME", "key": key,
        "value": value, "metadata": meta})


def _lora_result(losses: list[float], evals: dict[int, float]) -> str:
    lines = [_event("submission_benchmark", "llama2_70b_lora", "0: "),
             _event("opt_base_learning_rate", 0.0004, "0: "),
             _event("tracked_stats", {"warmup_time": 164.4}, "0: ", step=0)]
    for i, loss in enumerate(losses):
        samples = 160 * (i + 1)
        lines.append(_event("tracked_stats", {"train_loss": loss}, "0: ", samples_count=samples,
                            lr=0.0004 - 1e-6 * i, step=10 * (i + 1)))
        if samples in evals:
            lines.append(_event("eval_accuracy", evals[samples], "0: ", samples_count=samples))
    lines.append(_event("run_stop", None, "0: ", status="success"))
    return "\n".join(lines) + "\n"


def test_training_rows_by_samples_counted_and_the_evaluation_loss(tmp_path: Path) -> None:
    path = tmp_path / "result_0.txt"
    losses = [3.2 / (1 + 0.1 * i) for i in range(20)]
    path.write_text(_lora_result(losses, {800: 0.95, 1600: 0.93, 3200: 0.92}))
    log = read_log(path)
    assert log.format == "text:mllog" and log.step_unit == "samples_count"
    assert log.steps[:3] == [160, 320, 480] and len(log.steps) == 20  # the set-up's clock: no row
    assert math.isclose(log.values("loss")[19], losses[19])
    assert math.isclose(log.values("lr")[0], 0.0004)
    assert dict(log.evals)[1600] == {"eval_loss": 0.93}  # Llama 2 LoRA: an evaluation loss
    assert analyze(path).verdict == "healthy"


def test_a_result_with_evaluations_only_is_judged_on_its_log_perplexity(tmp_path: Path) -> None:
    path = tmp_path / "result_1.txt"
    ppl = [2.75 - 0.003 * i for i in range(10)] + [math.nan]
    lines = [_event("submission_benchmark", "gpt3"),
             *(_event("eval_accuracy", v, epoch_num=50331648 * (i + 1))
               for i, v in enumerate(ppl))]
    path.write_text("\n".join(lines) + "\n")
    log = read_log(path)
    assert log.loss_is_evaluation and "evaluation loss" in log.notes[0]
    assert log.steps[1] == 2 * 50331648 and math.isnan(log.series["loss"][10])
    assert analyze(path).verdict == "degraded"


def test_an_accuracy_benchmark_keeps_its_quality_metric_under_its_name(tmp_path: Path) -> None:
    path = tmp_path / "result_2.txt"
    lines = [_event("submission_benchmark", "resnet"),
             *(_event("eval_accuracy", 0.3 + 0.05 * i, epoch_num=4 * (i + 1)) for i in range(8))]
    path.write_text("\n".join(lines) + "\n")
    log = read_log(path)
    assert "loss" not in log.series and log.values("accuracy")[7] == 0.3 + 0.05 * 7
    assert not log.loss_is_evaluation


def test_rnnt_word_error_rate_goes_down_and_stable_diffusion_names_its_metric(
        tmp_path: Path) -> None:
    path = tmp_path / "rnnt.txt"
    lines = [_event("submission_benchmark", "rnnt")]
    for epoch in range(1, 11):
        lines.append(_event("train_loss", 40.0 / epoch, epoch_num=epoch))
        lines.append(_event("eval_accuracy", 0.9 / epoch, epoch_num=epoch))
    path.write_text("\n".join(lines) + "\n")
    assert dict(read_log(path).evals)[10] == {"eval_wer": pytest.approx(0.09)}
    assert analyze(path).verdict == "healthy"
    path = tmp_path / "sd.txt"
    lines = [_event("submission_benchmark", "stable_diffusion")]
    for i in range(1, 9):
        lines.append(_event("tracked_stats", {"loss": 0.2 - 0.01 * i}, step_num=1000 * i))
        lines += [_event("eval_accuracy", 90.0 / i, step_num=1000 * i, metric="FID"),
                  _event("eval_accuracy", 0.1 + 0.01 * i, step_num=1000 * i, metric="CLIP")]
    path.write_text("\n".join(lines) + "\n")
    log = read_log(path)
    assert log.step_unit == "step_num" and set(dict(log.evals)[8000]) == {"eval_fid", "eval_clip"}


def test_evaluations_on_another_counter_than_the_training_rows_are_left_out(
        tmp_path: Path) -> None:
    path = tmp_path / "result.txt"
    lines = [_event("tracked_stats", {"train_loss": 3.0 - 0.1 * i}, samples_count=1000 * i)
             for i in range(1, 9)]
    lines.append(_event("eval_accuracy", 0.9, epoch_num=5))  # not a samples count
    path.write_text("\n".join(lines) + "\n")
    log = read_log(path)
    assert log.steps[0] == 1000 and not log.evals


def test_a_benchmarks_own_training_prints_are_read_when_the_events_hold_evaluations_only(
        tmp_path: Path) -> None:
    """An MLPerf RNN-T result whose training loss is printed by the benchmark's own logger
    (NVIDIA's DLLogger lines), its MLLOG events holding the word error rate only: the training
    lines, which say more of the run, are read. A result of evaluations alone is still judged
    on them."""
    lines = [_event("submission_benchmark", "rnnt")]
    for epoch in range(1, 7):
        for it in range(10, 140, 10):
            loss = 30.0 / epoch if epoch < 5 else 30.0 * 40 * (it / 10)  # blows up in epoch 5
            lines.append(f"DLL 2023-10-04 04:30:58.300416 - epoch {epoch:4d} | iter {it:4d}/136 "
                         f"| loss {loss:.2f} | utts/s   548 | took  3.74 s | lrate 9.42e-05")
        lines.append(_event("eval_accuracy", 0.5 / epoch if epoch < 5 else 1.0,
                            epoch_num=epoch))
    path = tmp_path / "result_0.txt"
    path.write_text("\n".join(lines) + "\n")
    result = analyze(path)
    assert result.log is not None and result.log.format == "text:generic"
    assert result.verdict == "degraded" and result.onset is not None
    assert result.onset.startswith("epoch 5")
    only = tmp_path / "result_1.txt"
    only.write_text("\n".join(line for line in lines if ":::MLLOG" in line) + "\n")
    assert read_log(only).format == "text:mllog"


def test_a_dict_of_scores_is_one_series_per_metric(tmp_path: Path) -> None:
    # Mask R-CNN's results log its box and mask mAP in one event
    path = tmp_path / "result_0.txt"
    lines = [_event("submission_benchmark", "maskrcnn"),
             *(_event("eval_accuracy", {"BBOX": 0.05 * (i + 1), "SEGM": 0.04 * (i + 1)},
                      epoch_num=i + 1) for i in range(4))]
    path.write_text("\n".join(lines) + "\n")
    log = read_log(path)
    assert log.format == "text:mllog" and log.steps == [1, 2, 3, 4]
    assert math.isclose(log.values("accuracy/bbox")[3], 0.2)
    assert math.isclose(log.values("accuracy/segm")[0], 0.04)
