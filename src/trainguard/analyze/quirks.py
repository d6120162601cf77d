"""What logged numbers mean beyond their face value, read the same way for every format.

- **NaN-filtered windows.** The HF Trainer (`logging_nan_inf_filter=True`, its default) leaves
  NaN/inf losses out of the logged mean, and a window whose losses were *all* NaN/inf is logged
  as `loss: 0.0`. A loss of exactly 0.0 beside a non-finite gradient norm, on a step the
  optimizer skipped, or right after a NaN or a blown-up loss (`BLOWUP` times its median so far,
  for logs without a grad norm, of a loss that never goes below 0) is such a window: it is read
  as NaN.
- **Skipped steps.** A logged row is a skipped optimizer step (a GradScaler or DeepSpeed fp16
  overflow: no update, the scheduler not advanced) when the log says so (a DeepSpeed `OVERFLOW!`
  message, a skipped-iterations counter, a trainguard store's overflow flag), when the fp16 loss
  scale falls from one row to the next (each overflow halves it), or when the learning rate
  stays frozen under an active schedule. Frozen means exactly equal to the row before, which is
  only read where the LR is written in full precision (a computed float of 6 significant digits
  or more, as JSON, TensorBoard, CSV and printed Python dicts hold it; loggers that round it to
  a few digits cannot say).
  Under an active schedule means a schedule known to change every step: the LR moved on each
  of the 3 rows before, and then either moved the same way just after the frozen rows (a
  schedule that paused), or was decaying and stopped moving for the rest of the log above
  `FLOOR` of its peak (a decay does not stop above its floor); or it is exactly 0 before it
  ever rose (a warmup from 0 has moved after one applied step). A step schedule (StepLR), a
  warm-up then a constant LR, or a manual change is never read as skipped steps.
  Skipped rows are handed to the detectors as GradScaler overflows, which the gradient detectors
  leave to `fp16_overflow`, as they do live.
- **AMP skips.** A non-finite grad norm beside a finite loss, with the next logged loss finite
  too, is a step the loss scaler skipped (`amp_skips`): a NaN update would have made every later
  loss NaN. It is a skipped row, at the start as anywhere, not a divergence.
- **A gradient norm that is 0 on every row** is not a measurement (Megatron-DeepSpeed logs
  `grad norm: 0.000` when the norm is not computed): the series is dropped.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from trainguard.analyze.log import GRAD_NORM, LOSS, LOSS_SCALE, LR, Log

FLOOR = 0.1
"""The lowest share of its peak a decaying schedule is taken to end at (min_lr is conventionally
10% of the peak or less): a decay frozen above it is skipping steps, one frozen below may have
reached its floor."""


def prepare(log: Log) -> Log:
    """The log with its values read for what they mean (a copy; notes say what changed)."""
    series = log.series.copy()  # sparse series stay sparse: only the canonical ones are read
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
    if LR in series and log.skipped is None:
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
        previous: float | None = None  # the last logged loss, as read
        level: list[float] = []  # the finite, non-zero losses so far
        # a loss that goes below 0 (a policy-gradient surrogate, 0 exactly where every reward
        # of a group is equal) takes 0.0 as a value: no filtered window is read from a jump
        signed = any(loss is not None and loss < 0 for loss in losses)
        for i, loss in enumerate(losses):
            if loss is None:
                continue
            grad = grads[i] if grads is not None else None
            if loss == 0.0 and ((grad is not None and not math.isfinite(grad)) or skipped[i]
                                or (grad is None and not signed
                                    and _after_blowup(previous, level))):
                fixed[i] = math.nan
                filtered += 1
            previous = fixed[i]
            if fixed[i] is not None and math.isfinite(fixed[i]) and fixed[i] != 0:  # type: ignore[arg-type]
                level.append(fixed[i])  # type: ignore[arg-type]
        if filtered:
            series[LOSS] = fixed
            notes.append(f"{filtered} row(s) with loss 0.0 beside a NaN grad norm, on a skipped "
                         "step or right after the loss blew up: windows whose losses were all "
                         "NaN/inf (HF's logging_nan_inf_filter), read as NaN")
    if grads is not None:
        amp = amp_skips(series[LOSS] if LOSS in series else None, grads, skipped)
        if any(amp):
            rows = [i for i, flag in enumerate(amp) if flag]
            named = ", ".join(log.label(i) for i in rows[:3]) + (" ..." if len(rows) > 3 else "")
            after = ("beside a finite loss that stays finite after" if LOSS in series else
                     "followed by a finite one")
            notes.append(f"{len(rows)} row(s) with a non-finite grad norm {after} ({named}): "
                         "steps the fp16 loss scaler skipped, not a NaN in the weights")
            skipped = [a or b for a, b in zip(skipped, amp, strict=True)]
    return dataclasses.replace(log, series=series, notes=notes,
                               skipped=skipped if any(skipped) else None)


def amp_skips(losses: list[float | None] | None, grads: list[float | None],
              skipped: list[bool]) -> list[bool]:
    """Rows whose grad norm is non-finite while their loss is finite and the next logged loss is
    finite too: had that gradient been applied, the weights would be NaN and so would every
    loss after it; a finite loss after it says the step was skipped (GradScaler, at the start
    while it calibrates its scale, or anywhere later). In a log without a loss (`losses` None)
    the gradient norm says the same of itself: non-finite rows that a finite norm follows were
    skipped, as NaN weights never give a finite gradient again. On the last row nothing follows:
    it is read as such a skip when the run's earlier ones were."""
    out = [False] * len(grads)
    ahead = _next_finite(grads) if losses is None else []
    held = [i for i, v in enumerate(grads) if v is not None]
    # the last row alone after a finite norm; non-finite on two rows to the end is no skip
    alone = len(held) >= 2 and _finite(grads[held[-2]])
    for i, grad in enumerate(grads):
        if grad is None or math.isfinite(grad) or skipped[i]:
            continue
        if losses is None:
            following = ahead[i] if ahead[i] is not None or (i == held[-1] and alone) \
                else math.nan
        else:
            loss = losses[i]
            if loss is None or not math.isfinite(loss):
                continue
            following = next((v for v in losses[i + 1:] if v is not None), None)
        if following is not None and math.isfinite(following):
            out[i] = True
        elif following is None and any(out):  # the last row: the run has shown it skips them
            out[i] = True
    return out


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _next_finite(values: list[float | None]) -> list[float | None]:
    """For each row, the first finite value after it (None if there is none)."""
    out: list[float | None] = [None] * len(values)
    found: float | None = None
    for i in range(len(values) - 1, -1, -1):
        out[i] = found
        value = values[i]
        if _finite(value):
            found = value
    return out


BLOWUP = 100.0
"""A loss this many times its median so far has blown up: a 0.0 right after it is no learning."""


def _after_blowup(previous: float | None, level: list[float]) -> bool:
    """The row before was NaN (a filtered window goes on), or a loss `BLOWUP` times the run's
    median level: a loss cannot fall from there to exactly 0 by learning in one window."""
    if previous is None:
        return False
    if not math.isfinite(previous):
        return True
    if len(level) < 3 or previous == 0:
        return False
    ordered = sorted(level[:-1])
    return previous >= BLOWUP * ordered[len(ordered) // 2]


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
    values: list[float] = [lrs[i] for i in rows]  # type: ignore[misc]
    if len(values) < 3 or not full_precision(values):
        return out
    peak = max(values)
    k = 0
    while k < len(values):
        j = k
        while j + 1 < len(values) and values[j + 1] == values[k]:
            j += 1
        value = values[k]
        before = _sign(value - values[k - 1]) if k > 0 else 0
        after = _sign(values[j + 1] - value) if j + 1 < len(values) else 0
        moving = _moved_each_row(values, k)
        frozen: range = range(0)
        if value == 0 and after > 0 and j > k:
            frozen = range(k, j + 1)  # not started: no step was applied yet
        elif j > k and moving and before == after:
            frozen = range(k + 1, j + 1)  # the schedule paused
        elif j > k and moving and before < 0 and after == 0 and value > FLOOR * peak:
            frozen = range(k + 1, j + 1)  # a decay stopped above its floor
        for at in frozen:
            out[rows[at]] = True
        k = j + 1
    return out


MOVING_ROWS = 3
"""A schedule is known to change every step when it moved on each of this many rows before."""
DIGITS = 6
"""Significant digits that say an LR was written in full (a computed schedule's float), so that
an unchanged value means an unchanged LR; a log that rounds it (`9.999e-05`) cannot say."""


def _moved_each_row(values: list[float], k: int) -> bool:
    """The LR changed on each of the `MOVING_ROWS` rows before row `k` (a warm-up's peak
    between them included)."""
    if k < MOVING_ROWS:
        return False
    window = values[k - MOVING_ROWS:k + 1]
    return all(b != a for a, b in itertools.pairwise(window))


PRECISION_SAMPLE = 200


def full_precision(values: list[float]) -> bool:
    """Most distinct non-zero LRs carry `DIGITS` significant digits or more (judged on up to
    `PRECISION_SAMPLE` of them, the first ones)."""
    distinct: set[float] = set()
    for value in values:
        if value != 0:
            distinct.add(value)
            if len(distinct) >= PRECISION_SAMPLE:
                break
    if not distinct:
        return False
    full = sum(_digits(v) >= DIGITS for v in distinct)
    return full * 2 > len(distinct)


def _digits(value: float) -> int:
    mantissa = f"{abs(value):.17g}".split("e")[0].replace(".", "").strip("0")
    shortest = repr(abs(value)).split("e")[0].replace(".", "").strip("0")
    return min(len(mantissa), len(shortest))


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)


def whole_interval_skips(log: Log, skipped: list[bool]) -> list[bool]:
    """The skipped rows that say every step since the row before was skipped: all of them in a
    log of every step; in a sparser one only rows whose LR did not move since the row before (a
    scheduler held for the whole interval). A non-finite grad norm on a row of a log written
    every 10 steps is one skipped step of the 10."""
    if log.interval() <= 1:
        return skipped
    lrs = log.values(LR)
    out = [False] * len(skipped)
    previous: float | None = None
    for i, lr in enumerate(lrs):
        if skipped[i] and lr is not None and previous is not None and lr == previous:
            out[i] = True
        if lr is not None:
            previous = lr
    return out
