"""The detectors' thresholds for a log: windows counted in logged rows, not optimizer steps.

The live detectors count steps: a baseline of 50 steps, a warm-up of 10, a divergence that must
last 10 steps. Offline they are handed one row at a time, so each window becomes a number of
rows. A log written every `interval` steps covers a window of W steps in W / interval rows; a
window also needs enough rows to mean something (a median of 2 values is no baseline), and no
window may be so long that a short log is all warm-up. So each window is

    rows = clamp(ceil(W / interval), at_least, at_most)

with `at_least` the fewest rows the statistic needs and `at_most` a share of the log's rows.
A log written every step (interval 1) of a few hundred rows or more keeps the live thresholds.

What is scaled, and the floor and cap of each (live value in steps):

    warmup_steps              10  ->  at least 2, at most a fifth of the rows
    baseline_window           50  ->  at least 10 (a median and MAD of fewer are noise)
    loss_spike_level_window   10  ->  at least 3
    divergence_window         10  ->  at least 3, at most a third of the rows
    divergence_patience       10  ->  at least 2, at most a fifth of the rows
    divergence_span           50  ->  at least 5
    rearm_steps                5  ->  at least 2
    overflow_window           50  ->  at least 4, at most half the rows
    overflow_skips             5  ->  scaled like its window, at least 2
    transient_horizon        500  ->  at least 10
    no_gradient_steps          3  ->  at least 2

Two thresholds follow the interval, and two the length of the log:

- `detectors.loss_spike.ratio` (2.5) and `detectors.loss_spike.early_ratio` (5): most trainers log
  the mean loss of the steps since the last row (HF, Megatron, word_language_model, mlx-lm), and a
  mean of `interval` steps is about sqrt(interval) times less noisy than one step. The ratios are
  taken as multiples of a step's noise in log space, so a row's ratio is exp(ln(ratio) /
  sqrt(interval)): 2.5 at interval 1, 1.34 at 10, 1.07 at 200. The noise guard
  (`detectors.loss_spike.zscore`, the jump against the log's own robust spread) still applies, so a
  log of single-step values (nanoGPT, Lightning's `*_step`), which is as noisy as a live run, must
  jump as far as a live run does; a loss printed beside its running average (`Loss 8.42 (10.30)`,
  PyTorch's `AverageMeter`) is one batch's, and its ratios are not taken down at all. The
  floor of that spread (`min_log_scale`, 0.05 on steps) is divided by sqrt(interval) alike.
- `detectors.loss_spike.zscore` and `detectors.grad_explosion.zscore` (6) in a log of fewer than
  `SHORT_LOG` rows (an excerpt): its baselines hold a handful of rows, whose robust spread is mostly
  the excursion being judged (a gradient norm climbing 0.24, 0.95, 2.4, 16 has a "spread" as wide as
  the climb), so the guard is lowered to `SHORT_LOG_ZSCORE` there and the ratio rules decide.
- An excerpt that begins mid-run (`Log.starts_at_start` false) has no first steps whose blow-up
  the early rule (`detectors.loss_spike.early_ratio` against the few rows seen) is for: it gets no
  such rule, and shows `EXCERPT_BASELINE` rows before a jump is judged against them (one row is no
  baseline: a mid-run log of single-batch losses may begin on its lowest value).

The gradient-norm ratios are not scaled: trainers log the norm of one step, not a mean, and
`detectors.loss_divergence.ratio` is not either: a sustained rise is not diluted by averaging. The
absolute gradient-norm limit of the guide
(1000, for a blow-up in the first steps of a live run, before any baseline) is not used offline:
a log's first row already shows the model's own scale, and a norm of 1e6 on every row of a run
whose loss falls (a model that is never clipped) is that model's normal, not an explosion; the
adaptive rules judge the norm against the run's own baseline.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

from trainguard.config import DetectorConfig

SHORT_LOG = 20
"""Fewer rows than this (twice the smallest baseline) is a short log, an excerpt."""
SHORT_LOG_ZSCORE = 1.5
"""The noise guards of a short log (see above)."""

_WINDOWS: dict[str, tuple[int, float | None]] = {
    # dotted field: (fewest rows, the most as a share of the log's rows)
    "common.warmup_steps": (2, 1 / 5),
    "common.baseline_window": (10, None),
    "loss_spike.level_window": (3, None),
    "loss_divergence.window": (3, 1 / 3),
    "loss_divergence.patience": (2, 1 / 5),
    "loss_divergence.span": (5, None),
    "common.rearm_steps": (2, None),
    "fp16_overflow.window": (4, 1 / 2),
    "common.transient_horizon": (10, None),
    "no_gradients.steps": (2, None),
}


def scaled_config(rows: int, interval: float, base: DetectorConfig | None = None, *,
                  from_start: bool = True, means: bool = True) -> DetectorConfig:
    """`base` (the defaults) with its windows counted in rows of a log of `rows` rows written
    every `interval` steps. `from_start`: whether the log begins at the start of training (an
    excerpt from mid-run has no first steps whose blow-up needs the early rule). `means`:
    whether a row's loss is the mean of the steps since the row before (the spike ratios are
    then taken down with its noise); False for a log of single batches' losses."""
    base = base or DetectorConfig()
    interval = max(interval, 1.0)
    changes: dict[str, Any] = {}
    for name, (fewest, share) in _WINDOWS.items():
        steps = _get(base, name)
        count = math.ceil(steps / interval)
        if share is not None:
            count = min(count, max(fewest, int(rows * share)))
        changes[name] = max(fewest, count)
    window = changes["fp16_overflow.window"]
    skips = math.ceil(base.fp16_overflow.skips * window / base.fp16_overflow.window)
    changes["fp16_overflow.skips"] = max(2, min(skips, window))
    changes["grad_explosion.abs_threshold"] = sys.float_info.max
    root = math.sqrt(interval) if means else 1.0
    for name in ("loss_spike.ratio", "loss_spike.early_ratio"):
        changes[name] = math.exp(math.log(_get(base, name)) / root)
    changes["common.min_log_scale"] = base.common.min_log_scale / root
    if rows < SHORT_LOG:
        for name in ("loss_spike.zscore", "grad_explosion.zscore"):
            changes[name] = min(_get(base, name), SHORT_LOG_ZSCORE)
    if not from_start:
        changes["loss_spike.early_ratio"] = sys.float_info.max
        changes["common.warmup_steps"] = max(changes["common.warmup_steps"], EXCERPT_BASELINE)
    return _replaced(base, changes)


def _get(config: DetectorConfig, dotted: str) -> Any:
    section, name = dotted.split(".")
    return getattr(getattr(config, section), name)


def _replaced(config: DetectorConfig, changes: dict[str, Any]) -> DetectorConfig:
    """`config` with its dotted fields changed, each section replaced whole."""
    by_section: dict[str, dict[str, Any]] = {}
    for dotted, value in changes.items():
        section, name = dotted.split(".")
        by_section.setdefault(section, {})[name] = value
    return dataclasses.replace(config, **{
        section: dataclasses.replace(getattr(config, section), **values)
        for section, values in by_section.items()})


EXCERPT_BASELINE = 3
"""Rows an excerpt from mid-run shows before a jump is judged against them."""
