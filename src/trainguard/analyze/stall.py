"""A run that learns nothing: the offline `stalled`, the live verdict's word.

What a log shows from its first row to its last, the first two on at least `MIN_ROWS` rows:

- **no training signal**: the loss and the gradient norm are exactly 0 on every row (a loss
  masked out entirely, labels that are all ignored: nothing reaches the weights);
- **a loss pinned at chance**: the same loss on every row, and that value is ln(k) for a small
  whole k to the digits the log writes (a DPO loss at ln 2 = 0.6931 with every reward 0: no
  preference is learned; a classifier that predicts a constant from its first step).

- **predictions that never change**: an accuracy (of the training rows or of evaluations)
  with one value, to every digit the log writes, on every one of at least `FROZEN_ROWS` rows
  (or several accuracies stuck at the same value, on as many values together) while the loss
  moves: the weights change and not one prediction does (a model that predicts one class
  whatever its input);
- **outputs that never change**: a loss written with `SIGNIFICANT_DIGITS` digits or more,
  the same on every one of at least `FROZEN_ROWS` distinct steps (dead units: on batches that
  differ, only a constant output repeats its loss to every digit);
- **an evaluation at chance throughout**: an evaluation loss with one value on every one of at
  least `MIN_ROWS` evaluations, and that value ln k to the digits the log writes (the same
  held-out data scored as a uniform guess each time: a model whose outputs never left it);
- **a loss that never leaves a guess**: in a log from the start of training, within
  `CHANCE_BAND` of ln k on each of at least `FROZEN_ROWS` rows (a linear model on data it
  cannot split moves its loss in the last digits only); or within `GUESS_BAND` of it while
  an accuracy stays within `GUESS_ACCURACY_BAND` of 1/k on every row too (a recurrent net on
  sequences too long for it: 0.6993 -> 0.6935 over ten epochs at 50-51% accuracy): two
  measures of the same guess agree;
- **a loss pinned from its first row**: in a log from the start of training, within
  `PINNED_BAND` of its first value on every one of at least `PINNED_ROWS` rows, or within
  `TIGHT_BAND` on every one of at least `TIGHT_ROWS` epochs (`FROZEN_ROWS` rows of another
  unit), written finely enough to show it (an epoch loss written to seven digits that moves
  only in its last two), whatever the
  level (a regression's error has no chance value to compare with).

And from some row on (`went_to_zero`): **a loss that dropped to exactly 0 and stayed**: from a
level at least `ZERO_DROP` units of its last written digit to 0 in one row, then 0 to every
digit on each of at least `FROZEN_ROWS` rows to the end (a loss that learns approaches 0 over
many rows; one that is 0 at once from a real level lost its signal: labels all ignored, a mask
that leaves nothing). Its onset is the first row at 0. And (`went_frozen`) **a loss that froze**:
the loss, or a term of it (`hm_loss` beside the total), that moved on every row and then holds
one value written with `TAIL_DIGITS` digits or more on each of its last `TAIL_ROWS` distinct
steps or more (a head whose outputs stopped changing). Its onset is the first frozen row.

A plateau that moves, a loss that comes down later, a constant loss written with few digits, an
accuracy that stays at 1: none of these say so, and the verdict is left to the rest of the
judgement.
"""

from __future__ import annotations

import itertools
import math

from trainguard.analyze import resolution
from trainguard.analyze.chance import ACCURACY, MAX_GUESSED_CLASSES
from trainguard.analyze.log import GRAD_NORM, LOSS, Log, is_train_loss
from trainguard.chance_level import chance_loss

MIN_ROWS = 3
"""Rows a log needs before a loss that never moved says the run learns nothing."""


FROZEN_ROWS = 10
"""Rows an accuracy must hold one value on, while the loss moves, before it says that no
prediction changed: a converged model's accuracy on a small evaluation set may repeat a few
times, not on every row of a log from its first."""


def learns_nothing(log: Log) -> str | None:
    """Why the run learned nothing from its first logged row to its last, or None."""
    value = _the_one_value(log.values(LOSS))
    if value is None:
        return (_frozen_accuracy(log) or _near_chance(log) or _guessing(log)
                or _evaluation_at_chance(log) or _pinned(log))
    count = sum(v is not None for v in log.values(LOSS))
    if value == 0:
        if _the_one_value(log.values(GRAD_NORM)) == 0:
            return (f"the loss and the gradient norm are exactly 0 on all {count} rows: "
                    "no training signal reaches the weights")
        return None
    classes = _chance_classes(value)
    if classes is None:
        return _frozen_loss(log, value)
    return (f"the loss is {value:g} on all {count} rows, ln {classes} = "
            f"{chance_loss(classes):.4g}: the model never got better than a guess between "
            f"{classes} choices")


SIGNIFICANT_DIGITS = 4
"""Digits a loss must be written with for its repeating on every row to say that the outputs
never changed (a loss rounded to 0.01 repeats on a converged plateau)."""


def _frozen_loss(log: Log, value: float) -> str | None:
    """A loss written with `SIGNIFICANT_DIGITS` digits or more that is the same on every row
    of at least `FROZEN_ROWS` distinct steps: on batches that differ from step to step, only a
    model whose outputs do not change (dead units, a constant prediction) repeats its loss to
    every digit. A progress bar reprinting one value on the same step is no such log."""
    rows = [i for i, v in enumerate(log.values(LOSS)) if v is not None]
    steps = {log.steps[i] for i in rows}
    if len(steps) < FROZEN_ROWS or significant_digits(value) < SIGNIFICANT_DIGITS:
        return None
    return (f"the loss is {value:g} on all {len(rows)} rows ({log.label(rows[0])} to "
            f"{log.label(rows[-1])}), to every digit written: the model's outputs never "
            "changed, so it learned nothing")


def significant_digits(value: float) -> int:
    """Significant digits of the shortest text that writes `value` (0.01: 1; 7.7125: 5)."""
    mantissa = repr(abs(value)).split("e")[0].replace(".", "").lstrip("0").rstrip("0")
    return len(mantissa)


CHANCE_BAND = 0.005
"""A loss within this share of ln k on every row, from the start, never left a guess."""


def _losses_from_start(log: Log) -> list[float] | None:
    """The losses of a log from the start of training, at least `FROZEN_ROWS` and all finite,
    or None: what the rules of a loss that never left a guess judge."""
    values = [v for v in log.values(LOSS) if v is not None]
    if (len(values) < FROZEN_ROWS or not all(math.isfinite(v) for v in values)
            or not log.starts_at_start()):
        return None
    return values


def _near_chance(log: Log) -> str | None:
    """A log from the start of training whose loss stayed within `CHANCE_BAND` of ln k, for
    one small whole k, on each of at least `FROZEN_ROWS` rows: it moved in its last digits
    only, and never got better than a guess (a linear model on data it cannot split)."""
    values = _losses_from_start(log)
    if values is None:
        return None
    for classes in range(2, MAX_GUESSED_CLASSES + 1):
        chance = chance_loss(classes)
        if all(abs(v - chance) <= CHANCE_BAND * chance for v in values):
            return (f"the loss stayed within {CHANCE_BAND:.1%} of ln {classes} = {chance:.4g} "
                    f"on all {len(values)} rows from the start ({min(values):.5g} to "
                    f"{max(values):.5g}): the model never got better than a guess between "
                    f"{classes} choices")
    return None


PINNED_ROWS = 100
"""Rows from the start a loss must stay pinned on for `_pinned`: long past any warm-up."""
PINNED_BAND = 0.005
"""The share of its first value a pinned loss never moves beyond, over all its rows: batch
noise alone moves a mean loss more than that on a run that learns."""


TIGHT_ROWS = 5
"""Epochs from the start a loss must stay within `TIGHT_BAND` of its first value on for
`_pinned` (each the mean over all the data: a model that learns anything in an epoch moves
the next one's), or `FROZEN_ROWS` rows of another unit..."""
TIGHT_BAND = 1e-4
"""...a band no run that learns keeps to, on any rows (its first rows least of all), and that
the log must write finely enough to show (its last digit's unit within the band)."""


def _pinned(log: Log) -> str | None:
    """A log from the start of training whose loss stays within `PINNED_BAND` of its first
    value on every one of at least `PINNED_ROWS` rows, or within `TIGHT_BAND` on every one of
    at least `TIGHT_ROWS` epochs (`FROZEN_ROWS` other rows), each as logged: whatever its
    level (a regression's error has no chance value), nothing was learned from the first
    update on."""
    values = [v for v in log.values(LOSS) if v is not None]
    fewest = TIGHT_ROWS if log.step_unit == "epoch" else FROZEN_ROWS
    if (len(values) < fewest or not all(math.isfinite(v) for v in values)
            or not log.starts_at_start() or values[0] <= 0 or log.row_span > 1):
        return None  # (a window's mean hides the batch noise the band is measured against)
    first = values[0]
    unit = resolution.quantum(log.values(LOSS))
    tight = unit is None or unit <= TIGHT_BAND * first
    band = PINNED_BAND if len(values) >= PINNED_ROWS else TIGHT_BAND if tight else 0.0
    if not band or not all(abs(v - first) <= band * first for v in values):
        return None
    return (f"the loss stayed within {band:.2%} of its first value {first:.5g} on all "
            f"{len(values)} rows from the start ({min(values):.5g} to {max(values):.5g}): the "
            "model learned nothing from its first update on")


def _evaluation_at_chance(log: Log) -> str | None:
    """An evaluation loss with one value on all of at least `MIN_ROWS` evaluations, that value
    ln k to the digits written, said in words; None otherwise."""
    series: dict[str, list[float | None]] = {}
    for _, metrics in log.evals:
        for name, logged in metrics.items():
            if "loss" in name.lower():
                series.setdefault(name, []).append(logged)
    for name, values in series.items():
        value = _the_one_value(values)
        classes = _chance_classes(value) if value is not None else None
        if value is not None and classes is not None:
            said = name if name.lower().startswith("eval") else f"eval {name}"
            return (f"{said} is {value:g} at all {len(values)} evaluations, ln {classes} = "
                    f"{chance_loss(classes):.4g}: the held-out data scored as a uniform guess "
                    f"between {classes} choices each time")
    return None


ZERO_DROP = 1000
"""Units of the last written digit a loss stood at before it dropped to exactly 0 in one row
(0.100427 written to 6 decimals: 100427 units)."""


def went_to_zero(log: Log) -> tuple[int, str] | None:
    """The row from which the loss is exactly 0 to the end after a drop from a real level in
    one row, and why in words; None otherwise."""
    values = log.values(LOSS)
    rows = [i for i, v in enumerate(values) if v is not None]
    if len(rows) < FROZEN_ROWS + 1:
        return None
    zero = len(rows)
    while zero > 0 and values[rows[zero - 1]] == 0:
        zero -= 1
    if zero == 0 or len(rows) - zero < FROZEN_ROWS:
        return None
    before = values[rows[zero - 1]]
    unit = resolution.quantum([before])
    if before is None or not math.isfinite(before) or unit is None or before < ZERO_DROP * unit:
        return None
    return rows[zero], (f"the loss dropped from {before:g} to exactly 0 in one row and is 0 on "
                        f"all {len(rows) - zero} rows after: no training signal reaches the "
                        "weights (labels all ignored, or a mask that leaves nothing)")


TAIL_ROWS = 4
"""Distinct steps a loss must repeat one value on, to the end of the log, for `went_frozen`."""
TAIL_DIGITS = 6
"""Significant digits that value must be written with: a mean over batches that differ does
not repeat to six digits on four steps while the model's outputs move."""


def went_frozen(log: Log) -> tuple[int, str] | None:
    """The row from which a training loss (the loss, or a term of it: `hm_loss` beside the
    total) holds one value to the end, written with `TAIL_DIGITS` digits or more on at least
    `TAIL_ROWS` distinct steps, after it moved on every row before; and why in words. None
    otherwise. A logger that reprints a stale value between refreshes repeats it before the
    end too, and is no such log."""
    for name in [LOSS, *sorted(n for n in log.series if n != LOSS and is_train_loss(n))]:
        found = _frozen_tail(log, name)
        if found is not None:
            return found
    return _tight_tail(log)


def _tight_tail(log: Log) -> tuple[int, str] | None:
    """The epoch from which the loss (each row an epoch's mean) stays within `TIGHT_BAND` on
    each of its last `TIGHT_ROWS` epochs or more, written finely enough to show it, after an
    epoch outside that band; and why in words. The band `_pinned` holds a loss to from its
    first epoch, reached later: a model that learns anything in an epoch moves the next one's
    mean by more, and one whose outputs stopped changing (a contrastive loss at its collapsed
    value) moves it only in the last digits. None otherwise."""
    if log.step_unit != "epoch" or log.row_span > 1:
        return None
    values = log.values(LOSS)
    rows = [i for i, v in enumerate(values) if v is not None]
    seen = [values[i] for i in rows]
    if len(seen) <= TIGHT_ROWS or not all(v is not None and math.isfinite(v) and v > 0
                                          for v in seen):
        return None
    unit = resolution.quantum(seen)
    low = high = seen[-1]
    assert low is not None and high is not None
    if unit is None or unit > TIGHT_BAND * low:
        return None
    start = len(seen) - 1
    while start > 0:
        value = seen[start - 1]
        assert value is not None
        if max(high, value) - min(low, value) > TIGHT_BAND * min(low, value):
            break
        low, high, start = min(low, value), max(high, value), start - 1
    if start == 0 or len({log.steps[i] for i in rows[start:]}) < TIGHT_ROWS:
        return None  # (pinned from the first epoch is `_pinned`'s)
    return rows[start], (
        f"the loss stayed within {TIGHT_BAND:.2%} ({low:.5g} to {high:.5g}) on all "
        f"{len(seen) - start} epochs from {log.label(rows[start])} to the end, after it moved "
        "before: the outputs it scores stopped changing, and the model learns nothing")


def _frozen_tail(log: Log, name: str) -> tuple[int, str] | None:
    values = log.values(name)
    rows = [i for i, v in enumerate(values) if v is not None]
    if len(rows) < TAIL_ROWS + 1:
        return None
    last = values[rows[-1]]
    if (last is None or not math.isfinite(last) or last == 0
            or significant_digits(last) < TAIL_DIGITS):
        return None
    start = len(rows)
    while start > 0 and values[rows[start - 1]] == last:
        start -= 1
    before = [values[i] for i in rows[:start]]
    if (not before or len({log.steps[i] for i in rows[start:]}) < TAIL_ROWS
            or any(a == b for a, b in itertools.pairwise(before))):
        return None
    classes = _chance_classes(last)
    chance = (f", ln {classes} = {chance_loss(classes):.4g}: a uniform guess between {classes} "
              "choices" if classes is not None else "")
    said, part = ("the loss", "the model") if name == LOSS else (name, "that part of the model")
    return rows[start], (
        f"{said} is {last!r} on all {len(rows) - start} rows from {log.label(rows[start])} to "
        f"the end, to every digit written, after it moved on every row before{chance}: the "
        f"outputs it scores stopped changing, and {part} learns nothing")


GUESS_BAND = 0.02
"""A loss within this share of ln k, with an accuracy within `GUESS_ACCURACY_BAND` of 1/k on
every row beside it, is a guess between k choices."""
GUESS_ACCURACY_BAND = 0.05
"""The share of 1/k an accuracy stays within while the model guesses (0.475-0.525 for two
choices: a guess scores 1/k give or take the sampling of the data)."""


def _guessing(log: Log) -> str | None:
    """A log from the start of training whose loss stayed within `GUESS_BAND` of ln k and one
    of whose accuracies stayed within `GUESS_ACCURACY_BAND` of 1/k, each on every one of at least
    `FROZEN_ROWS` rows: the model guessed between k choices from its first row to its last."""
    values = _losses_from_start(log)
    if values is None:
        return None
    accuracies = {name: [v for v in log.values(name) if v is not None]
                  for name in log.series if _is_accuracy(name)}
    for classes in range(2, MAX_GUESSED_CLASSES + 1):
        chance = chance_loss(classes)
        if not all(abs(v - chance) <= GUESS_BAND * chance for v in values):
            continue
        for name, seen in accuracies.items():
            if len(seen) >= FROZEN_ROWS and all(
                    abs(v - 1 / classes) <= GUESS_ACCURACY_BAND / classes for v in seen):
                return (f"the loss stayed within {GUESS_BAND:.0%} of ln {classes} = "
                        f"{chance:.4g} ({min(values):.4g} to {max(values):.4g}) and {name} "
                        f"within {GUESS_ACCURACY_BAND:.0%} of 1/{classes} ({min(seen):.4g} to "
                        f"{max(seen):.4g}) on all {len(values)} rows from the start: the "
                        f"model never got better than a guess between {classes} choices")
    return None


def _the_one_value(values: list[float | None]) -> float | None:
    """The finite value a series holds on every row that holds it (at least `MIN_ROWS`), or
    None: stops at the first other value, so a log that moves costs a few rows."""
    first: float | None = None
    count = 0
    for value in values:
        if value is None:
            continue
        if first is None:
            if not math.isfinite(value):
                return None
            first = value
        elif value != first:
            return None
        count += 1
    return first if count >= MIN_ROWS else None


FLOAT32_DIGITS = 7
"""Decimals beyond which a value is written with every digit it has: a float32 loss a tracker
keeps as a double (W&B, MLflow) is ln(k) to float32's precision, not to its 16 decimals."""
FLOAT32_PRECISION = 1e-6
"""Relative distance within which such a value is ln(k) (float32 keeps about 6e-8)."""


def _chance_classes(value: float) -> int | None:
    """The k whose ln(k) the value is, to the decimals it is written with (0.6931 -> 2), or to
    float32's precision when it is written with every digit."""
    text = repr(value)
    decimals = len(text.split(".", 1)[1]) if "." in text and "e" not in text else 0
    for classes in range(2, MAX_GUESSED_CLASSES + 1):
        chance = chance_loss(classes)
        if round(chance, decimals) == value or (
                decimals > FLOAT32_DIGITS
                and math.isclose(value, chance, rel_tol=FLOAT32_PRECISION)):
            return classes
    return None


def _frozen_accuracy(log: Log) -> str | None:
    """An accuracy with one value below 1 on all of at least `FROZEN_ROWS` rows while the loss
    moved, said in words; None otherwise."""
    losses = [v for v in log.values(LOSS) if v is not None and math.isfinite(v)]
    if len(losses) < 2 or min(losses) == max(losses):
        return None
    series: dict[str, list[float | None]] = {
        name: log.values(name) for name in log.series if _is_accuracy(name)}
    for _, metrics in log.evals:
        for name, number in metrics.items():
            if _is_accuracy(name):
                series.setdefault(f"{name} (evaluation)", []).append(number)
    frozen: dict[float, list[tuple[str, int]]] = {}
    for name, values in series.items():
        value = _the_one_value(values)
        count = sum(v is not None for v in values)
        if value is not None and value < 1:
            frozen.setdefault(value, []).append((name, count))
    for value, seen in frozen.items():
        # one accuracy on enough rows, or several (the training rows' and the evaluations')
        # stuck at the same value on as many values together
        if sum(count for _, count in seen) >= FROZEN_ROWS and (
                len(seen) > 1 or seen[0][1] >= FROZEN_ROWS):
            names = " and ".join(name for name, _ in seen)
            rows = max(count for _, count in seen)
            return (f"{names} {'are' if len(seen) > 1 else 'is'} {value:g} on all {rows} rows "
                    f"while the loss moved ({losses[0]:.4g} -> {losses[-1]:.4g}): the weights "
                    "change and not one prediction does")
    return None


def _is_accuracy(name: str) -> bool:
    """An accuracy by its own name: the last part of a path-like name (`rewards/accuracy/std`
    is a reward function's spread, not an accuracy)."""
    return ACCURACY.search(name.rsplit("/", 1)[-1]) is not None
