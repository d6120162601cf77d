"""MLPerf's MLLOG lines: `:::MLLOG {"key": ..., "value": ..., "metadata": {...}}`, one event a
line (the `mlperf_logging` package writes them; every MLPerf training result holds them, often
after a rank prefix such as `0: `).

    training   `"key": "tracked_stats"` with a dict value that holds a loss
               (`{"train_loss": 2.1}`; the set-up's clocks are left out), or a key
               that names a loss (`train_loss`, `loss`) with a number; rows are numbered by
               one of the metadata's counters (`COUNTERS`: `samples_count` first)
    evaluation `"key": "eval_accuracy"`: MLPerf's quality metric, whose direction is the
               benchmark's (`submission_benchmark`): a log perplexity or a loss for the
               language models, read as `eval_loss`, RNN-T's word error rate as `eval_wer`
               (`LOWER_IS_BETTER`); an accuracy, a mAP, a Dice score for the others, read as
               `eval_accuracy`; a metric the metadata names (`FID`) under its name, and each
               of a dict of scores (Mask R-CNN's `{"BBOX": 0.21, "SEGM": 0.19}`) under
               `eval_accuracy/` and its own (`eval_accuracy/bbox`)
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

from trainguard.analyze.log import LOSS, LR, LogBuilder, number, whole_number

_LINE = re.compile(r":::MLLOG\s+(\{.*\})\s*$")
TRAIN_KEYS = frozenset({"train_loss", "loss", "training_loss"})
"""Event keys that carry the training loss as a number."""
LOWER_IS_BETTER = {"gpt3": "eval_loss", "llama2_70b_lora": "eval_loss", "llama31_": "eval_loss",
                   "rnnt": "eval_wer"}
"""Benchmarks (by the start of `submission_benchmark`) whose `eval_accuracy` goes down as the
model learns, and the name it is read under (MLPerf Training rules: GPT-3's and Llama 3.1's log
perplexity, GPT-3's target 2.69; Llama 2 70B LoRA's evaluation loss, target 0.925; RNN-T's word
error rate); the others' is an accuracy, a mAP, a Dice score. An event whose metadata names its
metric (Stable Diffusion's `FID`, `CLIP`) is read under that name."""
COUNTERS = ("samples_count", "step", "step_num", "epoch_num")
"""The metadata's counters, in the order a row is numbered by: `samples_count` is the one
MLPerf's training and evaluation events share (`epoch_num` counts samples too in some
results); one counter numbers every row of a file, the first that its training events (else
its evaluations) carry."""


def read_rows(lines: Iterable[str], log: LogBuilder) -> int:
    """Add the training rows (or, without any, the quality metric's evaluations as rows) of
    the MLLOG lines among `lines` to `log`; the number of rows."""
    benchmark = ""
    train: list[tuple[dict[str, Any], dict[str, float]]] = []
    quality: list[tuple[dict[str, Any], str, float]] = []
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
        elif key == "tracked_stats" and isinstance(value, dict):
            if any("loss" in str(k).lower() for k in value):  # not the set-up's clocks
                values = {k: v for k, v in ((k, number(v)) for k, v in value.items())
                          if v is not None}
                train.append((meta, _with_lr(values, meta)))
        elif key in TRAIN_KEYS and (loss := number(value)) is not None:
            train.append((meta, _with_lr({LOSS: loss}, meta)))
        elif key == "eval_accuracy" and (score := number(value)) is not None:
            metric = meta.get("metric")
            quality.append((meta, f"eval_{metric.lower()}" if isinstance(metric, str) else "",
                            score))
        elif key == "eval_accuracy" and isinstance(value, dict):  # one score per metric
            quality.extend((meta, f"eval_accuracy/{str(name).lower()}", score) for name, score
                           in ((k, number(v)) for k, v in value.items()) if score is not None)
    counter = _counter([meta for meta, _ in train] or [meta for meta, _, _ in quality])
    if counter is None:
        return 0
    default = next((name for prefix, name in LOWER_IS_BETTER.items()
                    if benchmark.startswith(prefix)), "eval_accuracy")
    log.step_unit = counter
    rows = [(meta[counter], values) for meta, values in train if whole_number(meta.get(counter))]
    evals = [(meta[counter], name or default, score) for meta, name, score in quality
             if whole_number(meta.get(counter))]
    if rows:
        for step, values in rows:
            log.add_entry(step, values)
        for step, name, score in evals:
            log.add_eval(step, {name: score})
        return len(rows)
    if not evals:
        return 0
    log.rows_are_evaluations = True  # a benchmark's own training prints may say more
    if default == "eval_loss":
        log.notes.append("the log holds no training loss: its evaluation loss (MLPerf's "
                         f"eval_accuracy of {benchmark}, lower is better) is judged")
        log.loss_is_evaluation = True
    else:
        log.notes.append("the log holds no training loss: its quality metric (MLPerf's "
                         "eval_accuracy) is all it says of the run")
    for step, name, score in evals:
        log.add(step, {LOSS if name == "eval_loss" else name.removeprefix("eval_"): score})
    return len(evals)


def _with_lr(values: dict[str, float], meta: dict[str, Any]) -> dict[str, float]:
    lr = number(meta.get("lr"))
    if lr is not None:
        values[LR] = lr
    return values


def _counter(metas: list[dict[str, Any]]) -> str | None:
    """The first of `COUNTERS` that the events' metadata carry (the most of them)."""
    best = max(COUNTERS, key=lambda name: (sum(whole_number(m.get(name)) for m in metas),
                                           -COUNTERS.index(name)))
    return best if any(whole_number(m.get(best)) for m in metas) else None
