"""Chance level: the cross-entropy of a uniform guess over `classes` classes, ln(classes).

A model that learned nothing of its task, or forgot it, predicts the same flat distribution for
every input and scores this loss (0.693 for 2 classes, 10.37 for a 32k vocabulary). The live
stall reasons, the batch check, the reading of a log and the demo all measure a loss against it.

Only the standard library here: every part of trainguard may import this module.
"""

from __future__ import annotations

import math


def chance_loss(classes: int) -> float:
    """ln(`classes`): the cross-entropy of a uniform guess over `classes` classes (>= 1)."""
    return math.log(classes)
