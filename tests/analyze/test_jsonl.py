"""JSON Lines readers: an mmcv / MMEngine `*.log.json`, written as those runners write it."""

from __future__ import annotations

import json
import math
from pathlib import Path

from trainguard.analyze import analyze, read_log


def _mmcv_log(path: Path, epochs: int = 3, nan_at: tuple[int, int] | None = None) -> Path:
    records: list[dict[str, object]] = [{"env_info": "sys.platform: linux\nCUDA available: True",
                                         "seed": 0, "exp_name": "faster_rcnn.py"}]
    for epoch in range(1, epochs + 1):
        for it in range(50, 201, 50):
            loss: float = round(1.6 - 0.1 * epoch - it / 4000, 4)
            if nan_at is not None and (epoch, it) >= nan_at:
                loss = math.nan
            records.append({"mode": "train", "epoch": epoch, "iter": it, "lr": 0.02,
                            "memory": 3100, "data_time": 0.01, "loss_rpn_cls": 0.3,
                            "loss_bbox": 0.4, "loss": loss, "grad_norm": 5.0, "time": 0.5})
        records.append({"mode": "val", "epoch": epoch, "iter": 500, "lr": 0.02,
                         "bbox_mAP": 0.1 * epoch})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))  # NaN as NaN, as Python's
    return path


def test_an_mmcv_log_json_is_read_as_json_lines_across_epochs(tmp_path: Path) -> None:
    log = read_log(_mmcv_log(tmp_path / "20240501_120000.log.json"))
    assert log.format == "jsonl"
    assert log.steps == [50 * k for k in range(1, 13)]  # iter starts again each epoch
    assert log.label(4) == "epoch 2, iter 50"
    assert "seed" not in log.series  # the header record is no step
    assert [(step, metrics["bbox_mAP"]) for step, metrics in log.evals] == [
        (200, 0.1), (400, 0.2), (600, 0.30000000000000004)]


def test_an_mmcv_nan_is_named_by_epoch_and_iter(tmp_path: Path) -> None:
    result = analyze(_mmcv_log(tmp_path / "run.log.json", nan_at=(3, 100)))
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "epoch 3, iter 100")


def test_detectron2_metrics_json_is_judged_on_its_total_loss(tmp_path: Path) -> None:
    """detectron2's `metrics.json`: the terms first by name (`loss_box_reg`, `loss_cls`), the
    sum the optimizer minimises as `total_loss`; a term going up alone is not the run's loss."""
    rows = [{"data_time": 0.01, "iteration": 20 * i + 19, "loss_box_reg": 0.1 + 0.02 * i,
             "loss_cls": 0.5 - 0.02 * i, "lr": 0.00025, "time": 0.5,
             "total_loss": 1.2 - 0.02 * i} for i in range(30)]
    path = tmp_path / "metrics.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = read_log(path)
    assert log.values("loss") == [r["total_loss"] for r in rows]
    assert "total_loss is read as the training loss" in log.notes


def test_a_wandb_history_on_its_own_is_read_at_the_trainers_step(tmp_path: Path) -> None:
    """W&B's `_step` counts its log calls; the HF Trainer's `train/global_step` is the run's."""
    rows = [{"_step": i, "_runtime": 1.0 * i, "train/loss": 2.0 - 0.01 * i,
             "train/learning_rate": 1e-4, "train/global_step": 10 * (i + 1)} for i in range(30)]
    path = tmp_path / "wandb-history.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = read_log(path)
    assert log.steps == [10 * (i + 1) for i in range(30)]


def test_one_record_per_epoch_is_numbered_by_its_epoch(tmp_path: Path) -> None:
    """DeiT, MAE and ConvNeXt write one JSON record per epoch to `log.txt`, with no step."""
    path = tmp_path / "log.txt"
    records = [{"train_lr": 1e-5 * (e + 1), "train_loss": 0.73 * 0.8 ** e,
                "test_acc1": 10.0 + e, "epoch": e, "n_parameters": 86000000}
               for e in range(8)]
    for record in records[5:]:
        record["train_loss"] = math.nan
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    log = read_log(path)
    assert log.steps == list(range(8)) and log.step_unit == "epoch"
    assert not any("numbered by their line" in note for note in log.notes)
    result = analyze(path)
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "epoch 5")
