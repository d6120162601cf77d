"""MLPerf's MLLOG lines: `:::MLLOG {"key": ..., "value": ..., "metadata": {...}}`, one event a
line (the `mlperf_logging` package writes them; every MLPerf training result holds them, often
after a rank prefix such as `0: `).

    training   `"key": "tracked_stats"` with a dict value that holds a loss
               (`{"train_loss": 2.1}`; the set-up's clocks are left out), or a key
               that names a loss (`train_loss`, `loss`) with a number; the row is the
               metadata's `step`, else its `samples_count`, else its `epoch_num`
    evaluation `"key": "eval_accuracy"`: MLPerf's quality metric, whose direction is the
               benchmark's (`submission_benchmark`): a log perplexity or a loss for the
               language models (`LOSS_BENCHMARKS`), read as `eval_loss`; an accuracy, a mAP, a
               Dice score for the others, read as `eval_accuracy`
    skipped    the run's set-up events (`submission_*`, `opt_*`, `init_start`, `block_start`):
               strings, or numbers that are settings, not measurements

A log with evaluations only (a GPT-3 result logs its log perplexity every 50M samples) is
judged on them: an evaluation loss stands for the training loss, as a note says; an accuracy
alone is kept under its name, never read as a loss.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from trainguard.analyze.log import LOSS, LR, LogBuilder, number

_LINE = re.compile(r":::MLLOG\s+(\{.*\})\s*$")
TRAIN_KEYS = frozenset({"train_loss", "loss", "training_loss"})
"""Event keys that carry the training loss as a number."""
LOSS_BENCHMARKS = ("gpt3", "llama2_70b_lora", "llama31_")
"""Benchmarks (by the start of `submission_benchmark`) whose `eval_accuracy` is a log
perplexity or an evaluation loss, where lower is better (MLPerf Training rules: GPT-3's and
Llama 3.1's log perplexity, GPT-3's target 2.69; Llama 2 70B LoRA's evaluation loss, target
0.925)."""
COUNTERS = ("samples_count", "step", "epoch_num")
"""The metadata's counters, in the order a row is numbered by: `samples_count` is the one
MLPerf's training and evaluation events share (`epoch_num` counts samples too in some
results)."""


def read_rows(lines: Iterable[str], log: LogBuilder) -> int:
    """Add the training rows (or, without any, the quality metric's evaluations as rows) of
    the MLLOG lines among `lines` to `log`; the number of rows."""
    benchmark = ""
    train: list[tuple[int, dict[str, float]]] = []
    quality: list[tuple[int, float]] = []
    units: dict[str, str] = {}  # the counter of the first row of each kind
    for line in lines:
        if ":::MLLOG" not in line:
            continue
        found = _LINE.search(line)
        if found is None:
            continue
        try:
            event = json.loads(found.group(1))
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        key, value = event.get("key"), event.get("value")
        meta = event.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        if key == "submission_benchmark" and isinstance(value, str):
            benchmark = value.lower()
            continue
        at = _counter(meta)
        if at is None:
            continue
        step, name = at
        if key == "tracked_stats" and isinstance(value, dict):
            if not any("loss" in str(k).lower() for k in value):
                continue  # the set-up's clocks (`warmup_time`, `before_model_init`)
            values = {k: v for k, v in ((k, number(v)) for k, v in value.items())
                      if v is not None}
        elif key in TRAIN_KEYS and number(value) is not None:
            values = {LOSS: number(value)}  # type: ignore[dict-item]
        elif key == "eval_accuracy" and number(value) is not None:
            quality.append((step, number(value)))  # type: ignore[arg-type]
            units.setdefault("quality", name)
            continue
        else:
            continue
        lr = number(meta.get("lr"))
        if lr is not None:
            values[LR] = lr
        if values:
            train.append((step, values))
            units.setdefault("train", name)
    if not train and not quality:
        return 0
    lower = benchmark.startswith(LOSS_BENCHMARKS)
    quality_name = "eval_loss" if lower else "eval_accuracy"
    log.step_unit = units.get("train") or units["quality"]
    if train:
        for step, values in train:
            log.add_entry(step, values)
        for step, value in quality:
            log.add_eval(step, {quality_name: value})
        return len(train)
    if lower:
        log.notes.append("the log holds no training loss: its evaluation loss (MLPerf's "
                         f"eval_accuracy of {benchmark}, lower is better) is judged")
        log.loss_is_evaluation = True
    else:
        log.notes.append("the log holds no training loss: its quality metric (MLPerf's "
                         "eval_accuracy) is all it says of the run")
    for step, value in quality:
        log.add(step, {LOSS if lower else "accuracy": value})
    return len(quality)


def _counter(meta: dict[str, Any]) -> tuple[int, str] | None:
    """The event's step from its metadata, and the counter's name."""
    for name in COUNTERS:
        value = meta.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value, name
    return None
