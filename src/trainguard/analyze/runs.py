"""Several runs in one log: a counter that starts again from where the log began.

A notebook cell that trains five cross-validation folds, a sweep that retrains a model per
setting, a script run twice into the same file: the log's counter (`Epoch 1/100`, `step 0`)
goes back to its first value and counts up again. Read as one run, each new start is a loss
jumping back to a fresh model's level: an explosion that recovered, four times over. Each run
is judged from its own start instead (`analysis.analyze_log`), when the whole log read as one
is not healthy.

A run starts again where the counter falls back to the first row's value or below it, from
above. A resume from a checkpoint goes back too, but to a later point than where the log began:
the same run, judged as one. Each run must hold `MIN_RUN_ROWS` rows and count up within itself,
or the log is left whole: lines of two runs written into one file in turn (their counters
alternate) are no sequence of runs.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

from trainguard.analyze.log import Log, Series

MIN_RUN_ROWS = 10
"""Rows each run must hold to be judged on its own (a level before trouble, and after it)."""

_COUNTER = re.compile(r"([A-Za-z_]+)\s*\[?\s*(\d+)")
"""A named counter in a row's label (`epoch 4`, `iteration 7010`, `Epoch [3`); the first one
is the outermost (`epoch 2, batch 400` counts epochs)."""


def counters(log: Log) -> list[int | None]:
    """The log's own counter at each row: its step where the rows carry no label, else the
    first counter the label names besides the row number (`row 101 (epoch 1)`: 1)."""
    if log.labels is None:
        return list(log.steps)
    out: list[int | None] = []
    for label in log.labels:
        value = None
        for match in _COUNTER.finditer(label or ""):
            if match.group(1).lower() != "row":
                value = int(match.group(2))
                break
        out.append(value)
    return out


def run_starts(log: Log) -> list[int]:
    """The rows (after the first) where a new run begins, or [] when the log is one run or its
    runs cannot be told apart (see the module's doc)."""
    if len(log) < 2 * MIN_RUN_ROWS:
        return []
    counted = counters(log)
    first = counted[0]
    if first is None:
        return []
    starts = []
    for row in range(1, len(counted)):
        now, before = counted[row], counted[row - 1]
        if now is None or before is None:
            continue
        if now <= first < before:
            starts.append(row)
        elif now < before:  # a counter going back within a run: a resume, or lines interleaved
            return []
    if not starts:
        return []
    bounds = [0, *starts, len(counted)]
    if any(end - start < MIN_RUN_ROWS for start, end in itertools.pairwise(bounds)):
        return []
    return starts


def run_of(log: Log, start: int, end: int) -> Log:
    """Rows `start` to `end` (excluded) of `log`, a log of their own, from the run's start."""
    series = Series(end - start, {name: log.series[name][start:end] for name in log.series})
    curvature = log.loss_curvature[start:end] if log.loss_curvature is not None else None
    return dataclasses.replace(
        log, steps=log.steps[start:end], series=series,
        labels=log.labels[start:end] if log.labels is not None else None,
        skipped=log.skipped[start:end] if log.skipped is not None else None,
        evals=[], notes=[], param_names=[], param_grad_norms=None, loss_curvature=curvature,
        from_start=log.from_start if start == 0 else True, own_verdict=None, own_events=[])
