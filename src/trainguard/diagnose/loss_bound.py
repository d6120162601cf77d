"""The most a loss computed from the model's own class scores can be, and a loss beyond it.

At one position the cross-entropy of a target t is log Z - z_t (log Z = logsumexp of the scores
z), so no target, right or wrong, costs more than log Z - min(z). `probes/logz.py` measures the
largest of these over the step's positions every step (`ce_ceiling`, in the step's one
transfer). A mean cross-entropy over the batch stays under it, and so do label smoothing and any
mix of targets. A loss handed over far above it was not computed from those scores alone: a
factor applied outside the model, a sum where a mean was meant, a division by the wrong count
(cause `loss_reduction`).

That also bounds what a data fault can do to the loss. A tokenizer mismatch changes which ids
the model reads, not how its loss is reduced: the model predicts uniformly (ln(vocab)) or is
confidently wrong within what its scores allow, and either way its loss is a cross-entropy of
the scores it made, under the ceiling. Beyond it, the ids are not what raised the loss.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from trainguard.diagnose.causes import CAUSES
from trainguard.finding import Finding

CEILING_KEY = "ce_ceiling"
"""The step signal (`signals.precursors`) and the event detail that carry the ceiling."""
BEYOND = 2.0
"""A loss at least this many times the ceiling is beyond it. The ceiling bounds the mean
cross-entropy itself; the margin leaves room for the small terms a loss may add to it (a z-loss,
1e-4 log Z^2; a load-balancing term), so a factor of 2 or less stays unsaid."""


def ceiling_of(precursors: Mapping[str, Any]) -> float | None:
    """The step's ceiling from its precursor signals; None when it was not measured (no class
    scores, the probe off, torch.distributed) or is not a finite positive number."""
    value = precursors.get(CEILING_KEY)
    if value is None:
        return None
    flat = np.asarray(value, dtype=np.float64).reshape(-1)
    if not flat.size or not math.isfinite(float(flat[0])) or float(flat[0]) <= 0:
        return None
    return float(flat[0])


def beyond(loss: float | None, ceiling: Any) -> bool:
    """Whether a finite loss is `BEYOND` its ceiling (False when either is unknown)."""
    return (isinstance(loss, (int, float)) and isinstance(ceiling, (int, float))
            and math.isfinite(loss) and math.isfinite(ceiling) and ceiling > 0
            and loss >= BEYOND * ceiling)


def describe(loss: float, ceiling: float) -> str:
    """The fact, in words: how far the loss stands above what the scores allow."""
    return (f"the loss {loss:.4g} is {loss / ceiling:.3g}x the most a cross-entropy of the "
            f"model's own class scores could cost ({ceiling:.3g})")


def check_first_loss(loss: float | None, ceiling: float | None) -> Finding | None:
    """A first loss beyond what the model's scores allow: the loss is reduced or scaled
    outside them from the start. A note (severity info): a constant factor is harmless under an
    adaptive optimizer (Adam's steps do not depend on it) and may be meant; under SGD it
    multiplies the LR."""
    if not beyond(loss, ceiling):
        return None
    assert loss is not None and ceiling is not None
    return Finding("loss_beyond_scores", "info",
                   f"{describe(loss, ceiling)} at the first step: it is not the mean "
                   "cross-entropy of the model's output (a sum, a factor, or a count it is "
                   "divided by).", CAUSES["loss_reduction"].fix, cause="loss_reduction",
                   evidence={"loss": loss, "ceiling": ceiling})
