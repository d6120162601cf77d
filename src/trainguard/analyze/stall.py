"""A run that learns nothing: the offline `stalled`, the live verdict's word.

Two things a log shows from its first row to its last, each on at least `MIN_ROWS` rows:

- **no training signal**: the loss and the gradient norm are exactly 0 on every row (a loss
  masked out entirely, labels that are all ignored: nothing reaches the weights);
- **a loss pinned at chance**: the same loss on every row, and that value is ln(k) for a small
  whole k to the digits the log writes (a DPO loss at ln 2 = 0.6931 with every reward 0: no
  preference is learned; a classifier that predicts a constant from its first step).

A plateau that moves, a loss that comes down later, a constant loss at any other value: none of
these say so, and the verdict is left to the rest of the judgement.
"""

from __future__ import annotations

import math

from trainguard.analyze.chance import MAX_GUESSED_CLASSES
from trainguard.analyze.log import GRAD_NORM, LOSS, Log

MIN_ROWS = 3
"""Rows a log needs before a loss that never moved says the run learns nothing."""


def learns_nothing(log: Log) -> str | None:
    """Why the run learned nothing from its first logged row to its last, or None."""
    losses = [v for v in log.values(LOSS) if v is not None]
    if len(losses) < MIN_ROWS or len(set(losses)) != 1 or not math.isfinite(losses[0]):
        return None
    value = losses[0]
    if value == 0:
        grads = [v for v in log.values(GRAD_NORM) if v is not None]
        if len(grads) >= MIN_ROWS and all(g == 0 for g in grads):
            return (f"the loss and the gradient norm are exactly 0 on all {len(losses)} rows: "
                    "no training signal reaches the weights")
        return None
    classes = _chance_classes(value)
    if classes is None:
        return None
    return (f"the loss is {value:g} on all {len(losses)} rows, ln {classes} = "
            f"{math.log(classes):.4g}: the model never got better than a guess between "
            f"{classes} choices")


def _chance_classes(value: float) -> int | None:
    """The k whose ln(k) the value is, to the decimals it is written with (0.6931 -> 2)."""
    text = repr(value)
    decimals = len(text.split(".", 1)[1]) if "." in text and "e" not in text else 0
    for classes in range(2, MAX_GUESSED_CLASSES + 1):
        if round(math.log(classes), decimals) == value:
            return classes
    return None
