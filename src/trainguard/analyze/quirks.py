"""What logged numbers mean beyond their face value, read the same way for every format.

- **NaN-filtered windows.** The HF Trainer (`logging_nan_inf_filter=True`, its default) leaves
  NaN/inf losses out of the logged mean, and a window whose losses were *all* NaN/inf is logged
  as `loss: 0.0`. A loss of exactly 0.0 beside a non-finite gradient norm, or on a step the
  optimizer skipped, is such a window: it is read as NaN.
- **Skipped steps.** A logged row is a skipped optimizer step (a GradScaler or DeepSpeed fp16
  overflow: no update, the scheduler not advanced) when the log says so (a DeepSpeed `OVERFLOW!`
  message, a skipped-iterations counter, a trainguard store's overflow flag), when the fp16 loss
  scale falls from one row to the next (each overflow halves it), or when the learning rate
  stays frozen under an active schedule. Frozen means exactly equal to the row before, which is
  only read in logs that write the LR in full precision (JSON, TensorBoard, CSV; text logs round
  it to a few digits). Under an active schedule means: the LR moved the same way just before and
  just after the frozen rows (a schedule that paused); or it was decaying and stopped moving for
  the rest of the log above `FLOOR` of its peak (a decay does not stop above its floor); or it
  is exactly 0 before it ever rose (a warmup from 0 has moved after one applied step).
  Skipped rows are handed to the detectors as GradScaler overflows, which the gradient detectors
  leave to `fp16_overflow`, as they do live.
- **A gradient norm that is 0 on every row** is not a measurement (Megatron-DeepSpeed logs
  `grad norm: 0.000` when the norm is not computed): the series is dropped.
"""

from __future__ import annotations

import dataclasses
import math

from trainguard.analyze.log import GRAD_NORM, LOSS, LOSS_SCALE, LR, Log

FLOOR = 0.1
"""The lowest share of its peak a decaying schedule is taken to end at (min_lr is conventionally
10% of the peak or less): a decay frozen above it is skipping steps, one frozen below may have
reached its floor."""


def prepare(log: Log) -> Log:
    """The log with its values read for what they mean (a copy; notes say what changed)."""
    series = dict(log.series)
    notes = list(log.notes)
    grads = series.get(GRAD_NORM)
    if grads is not None:
        finite = [g for g in grads if g is not None and math.isfinite(g)]
        if finite and all(g == 0 for g in finite) and len(finite) == sum(
                1 for g in grads if g is not None):
            del series[GRAD_NORM]
            grads = None
            notes.append("the grad norm is 0 on every row: not measured, left out")
    skipped = list(log.skipped) if log.skipped is not None else [False] * len(log.steps)
    explicit = sum(skipped)
    scale = series.get(LOSS_SCALE)
    if scale is not None:
        dropped = _scale_drops(scale)
        skipped = [a or b for a, b in zip(skipped, dropped, strict=True)]
    exact_lr = not log.format.startswith("text")
    if exact_lr and LR in series and log.skipped is None:
        frozen = frozen_lr(series[LR])
        if any(frozen):
            notes.append(f"{sum(frozen)} row(s) with the learning rate frozen under an active "
                         "schedule: skipped optimizer steps")
        skipped = [a or b for a, b in zip(skipped, frozen, strict=True)]
    if sum(skipped) > explicit and scale is not None and any(_scale_drops(scale)):
        notes.append(f"{sum(_scale_drops(scale))} row(s) where the loss scale fell: overflow "
                     "skips")
    losses = series.get(LOSS)
    if losses is not None:
        filtered = 0
        fixed = list(losses)
        for i, loss in enumerate(losses):
            if loss is None or loss != 0.0:
                continue
            grad = grads[i] if grads is not None else None
            if (grad is not None and not math.isfinite(grad)) or skipped[i]:
                fixed[i] = math.nan
                filtered += 1
        if filtered:
            series[LOSS] = fixed
            notes.append(f"{filtered} row(s) with loss 0.0 beside a NaN grad norm or a skipped "
                         "step: windows whose losses were all NaN/inf (HF's "
                         "logging_nan_inf_filter), read as NaN")
    return dataclasses.replace(log, series=series, notes=notes,
                               skipped=skipped if any(skipped) else None)


def _scale_drops(scale: list[float | None]) -> list[bool]:
    out = [False] * len(scale)
    previous: float | None = None
    for i, value in enumerate(scale):
        if value is None or not math.isfinite(value):
            continue
        if previous is not None and value < previous:
            out[i] = True
        previous = value
    return out


def frozen_lr(lrs: list[float | None]) -> list[bool]:
    """Rows whose learning rate stays frozen under an active schedule (see the module doc)."""
    out = [False] * len(lrs)
    rows = [i for i, v in enumerate(lrs) if v is not None and math.isfinite(v)]
    values = [lrs[i] for i in rows]
    if len(values) < 3:
        return out
    peak = max(values)  # type: ignore[type-var]
    k = 0
    while k < len(values):
        j = k
        while j + 1 < len(values) and values[j + 1] == values[k]:
            j += 1
        value = values[k]
        before = _sign(value - values[k - 1]) if k > 0 else 0  # type: ignore[operator]
        after = _sign(values[j + 1] - value) if j + 1 < len(values) else 0  # type: ignore[operator]
        frozen: range = range(0)
        if value == 0 and after > 0 and j > k:
            frozen = range(k, j + 1)  # not started: no step was applied yet
        elif j > k and before != 0 and before == after:
            frozen = range(k + 1, j + 1)  # the schedule paused
        elif j > k and before < 0 and after == 0 and value > FLOOR * peak:  # type: ignore[operator]
            frozen = range(k + 1, j + 1)  # a decay stopped above its floor
        for at in frozen:
            out[rows[at]] = True
        k = j + 1
    return out


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)
