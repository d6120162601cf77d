"""Training data ordered by label: each batch holds one class, the next ones another.

A loader built without `shuffle=True` over data stored class by class hands the model one class
at a time: it learns to predict that class, forgets the others, and its loss jumps at each
change of class (which the detectors then read as a divergence, and the ranking as an LR too
high). Seen from the batches the inspector already describes (`FieldStats`: a label field's
smallest and largest value), at no cost of its own: at least `MIN_BATCHES` inspected batches of
`MIN_BATCH` samples or more held a single label, `MIN_CLASSES` different ones among them, and
at most one in `MIXED_SHARE` others held several (the batch that spans a change of class). A
shuffled loader gives a batch of one class almost never (at most 2^(1-MIN_BATCH) on balanced
binary labels, less with more classes; on skewed labels, the single-class batches are all of
the common class). Told once per run.

The label field is found by its place: the last element of a tuple or list batch (`(x, y)`), or
a mapping key named as labels are (`LABEL_NAMES`); a 1-D field of non-negative integers. A field
of other names that holds one value per batch (a task or a dataset id, batches grouped by task)
is a choice, not this fault.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from trainguard.diagnose.batch import FieldStats
from trainguard.finding import Finding

MIN_BATCH = 8
"""Batches smaller than this can hold one class by chance."""
MIN_BATCHES = 3
"""Inspected single-label batches before it is told."""
MIN_CLASSES = 2
"""Different labels among them: batches of the one common class of skewed data are no order."""
MIXED_SHARE = 4
"""Inspected batches with several labels allowed per single-label batch, at most 1 in this
many: data stored class by class gives one at each change of class, a shuffled loader nearly
every batch."""
KEPT = 64
"""Single-label batches remembered per field (the most recent)."""
LABEL_NAMES = frozenset({"label", "labels", "y", "target", "targets", "class", "classes",
                         "class_id", "class_ids", "cls"})
_TUPLE_ITEM = re.compile(r"^\[(\d+)\]$")


def label_fields(stats: list[FieldStats]) -> list[FieldStats]:
    """The fields that hold a batch's class labels (see the module's text)."""
    items = [(int(m.group(1)), s) for s in stats if (m := _TUPLE_ITEM.match(s.name))]
    last = [s for i, s in items if i == max(j for j, _ in items)] if len(items) > 1 else []
    named = [s for s in stats if s.name.rsplit(".", 1)[-1].lower() in LABEL_NAMES]
    return [s for s in last + named
            if not s.is_float and s.dtype != "bool" and len(s.shape) == 1 and s.min >= 0]


@dataclass(slots=True)
class LabelOrder:
    """The labels of the inspected batches, per label field: one value each so far, or mixed."""

    single: dict[str, list[int]] = field(default_factory=dict)
    """Per field: the label of each inspected batch that held a single one."""
    mixed: dict[str, int] = field(default_factory=dict)
    """Per field: the inspected batches that held several labels."""
    told: bool = False

    def observe(self, stats: list[FieldStats], step: int) -> Finding | None:
        """The finding, the first time the inspected batches show labels in order."""
        if self.told:
            return None
        for s in label_fields(stats):
            if s.shape[0] < MIN_BATCH:
                continue
            if s.min != s.max:
                self.mixed[s.name] = self.mixed.get(s.name, 0) + 1
                continue
            seen = self.single.setdefault(s.name, [])
            seen.append(int(s.min))
            del seen[:-KEPT]
            if (len(seen) < MIN_BATCHES or len(set(seen)) < MIN_CLASSES
                    or self.mixed.get(s.name, 0) * MIXED_SHARE > len(seen)):
                continue
            self.told = True
            shown = ", ".join(map(str, seen[-8:]))
            return Finding(
                "batch_label_order", "warning",
                f"the batches inspected hold a single label in '{s.name}', a different one "
                f"from stretch to stretch ({len(seen)} of {len(seen) + self.mixed.get(s.name, 0)}"
                f" batches up to step {step}; their labels {shown}): "
                "the data comes ordered by label, so the model learns one class at a time and "
                "forgets the others.",
                "shuffle the training data (DataLoader(..., shuffle=True), or a sampler that "
                "mixes the classes).", cause="unshuffled_data",
                evidence={"field": s.name, "labels": seen[-8:], "batches": len(seen)})
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"single": {k: list(v) for k, v in self.single.items()},
                "mixed": dict(self.mixed), "told": self.told}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.single = {str(k): [int(v) for v in values]
                       for k, values in state.get("single", {}).items()}
        self.mixed = {str(k): int(v) for k, v in state.get("mixed", {}).items()}
        self.told = bool(state.get("told", False))
