"""Training data ordered by label: each batch holds one class (or a few neighbours), the next ones
another.

A loader built without `shuffle=True` over data stored class by class hands the model one class
at a time: it learns to predict that class, forgets the others, and its loss jumps at each
change of class (which the detectors then read as a divergence, and the ranking as an LR too
high). Seen from the batches the inspector already describes (`FieldStats`: a label field's
smallest and largest value), at no cost of its own.

A batch is *narrow* when its labels span at most a quarter of the labels the run's inspected
batches span (`NARROW_SHARE`; one label, on data of up to 7 classes): a shuffled batch of
`MIN_BATCH` samples or more spans nearly all of them. It is told once per run when at least
`MIN_BATCHES` of the last `KEPT` inspected batches were narrow, among them batches of a single
label for `MIN_CLASSES` different labels or more, and at most one in `MIXED_SHARE` of the others
was wide (the batch at a change of class is). The single labels tell order from skew: shuffled
data whose labels are mostly one class (or a long tail over many) gives narrow batches around
its common classes, and single-label ones of its most common class only. Batches inspected
because their step raised an event are the ones at a change of class more often than not: they
count when narrow, never as wide. A shuffled loader with balanced labels almost never gives a
narrow batch (at most 2^(1-MIN_BATCH) on binary labels).

The label field is found by its place: the second element of a tuple or list batch (`(x, y)`,
`(x, y, index)`, `(x, y, task)`), or a mapping key named as labels are (`LABEL_NAMES`);
non-negative integers, one per sample. A field whose one value is the length of another integer
field's rows (`(tokens, lengths)` bucketed by length) is no label; another field that holds one
value per batch (a task or a dataset id, batches grouped by task) is not looked at.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from trainguard.diagnose.batch import FieldStats
from trainguard.finding import Finding

MIN_BATCH = 8
"""Batches smaller than this can hold one class by chance."""
MIN_BATCHES = 3
"""Narrow batches among those kept before it is told."""
MIN_CLASSES = 2
"""Different labels among the single-label batches: batches of the one common class of skewed
data are no order."""
MIXED_SHARE = 4
"""Wide batches allowed per narrow one, at most 1 in this many: data stored class by class
gives one at each change of class, a shuffled loader nearly every batch."""
NARROW_SHARE = 4
"""A batch is narrow when its labels span at most 1/this of the run's span (at least one)."""
KEPT = 64
"""Inspected batches remembered per field (the most recent)."""
LABEL_NAMES = frozenset({"label", "labels", "y", "target", "targets", "class", "classes",
                         "class_id", "class_ids", "cls"})
LABEL_ITEM = "[1]"
"""The second element of a tuple or list batch."""


def label_fields(stats: list[FieldStats]) -> list[FieldStats]:
    """The fields that hold a batch's class labels (see the module's text)."""
    rows = [(s.name, s.shape[1]) for s in stats
            if len(s.shape) == 2 and s.shape[1] > 1 and not s.is_float]
    return [s for s in stats
            if (s.name == LABEL_ITEM or s.name.rsplit(".", 1)[-1].lower() in LABEL_NAMES)
            and not s.is_float and s.dtype != "bool" and s.min >= 0
            and (len(s.shape) == 1 or (len(s.shape) == 2 and s.shape[1] == 1))
            and not (s.min == s.max and any(s.min == n for name, n in rows if name != s.name))]


@dataclass(slots=True)
class LabelOrder:
    """The label ranges of the inspected batches, per label field."""

    ranges: dict[str, deque[tuple[int, int, bool]]] = field(default_factory=dict)
    """Per field: (smallest, largest label, inspected for an event) of the last `KEPT`
    inspected batches."""
    told: bool = False

    def observe(self, stats: list[FieldStats], step: int, fired: bool) -> Finding | None:
        """The finding, the first time the inspected batches show labels in order. `fired`: the
        batch was inspected because its step raised an event."""
        if self.told:
            return None
        for s in label_fields(stats):
            if s.shape[0] < MIN_BATCH:
                continue
            kept = self.ranges.setdefault(s.name, deque(maxlen=KEPT))
            kept.append((int(s.min), int(s.max), fired))
            finding = self._judge(s.name, kept, step)
            if finding is not None:
                self.told = True
                return finding
        return None

    def _judge(self, name: str, kept: deque[tuple[int, int, bool]], step: int
               ) -> Finding | None:
        span = max(hi for _, hi, _ in kept) - min(lo for lo, _, _ in kept) + 1
        narrow_span = max(1, span // NARROW_SHARE)
        narrow = [(lo, hi) for lo, hi, _ in kept if hi - lo + 1 <= narrow_span]
        wide = sum(1 for lo, hi, fired in kept if hi - lo + 1 > narrow_span and not fired)
        single = sorted({lo for lo, hi in narrow if lo == hi})
        if (len(narrow) < MIN_BATCHES or len(single) < MIN_CLASSES
                or wide * MIXED_SHARE > len(narrow)):
            return None
        shown = ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in narrow[-8:])
        held = ("a single label" if narrow_span == 1
                else f"at most {narrow_span} neighbouring labels")
        return Finding(
            "batch_label_order", "warning",
            f"the batches inspected hold {held} in '{name}' (of the {span} the run's batches "
            f"span), different ones from stretch to stretch ({len(narrow)} of {len(kept)} "
            f"batches up to step {step}; their labels {shown}): the data comes ordered by "
            "label, so the model learns a few classes at a time and forgets the others.",
            "shuffle the training data (DataLoader(..., shuffle=True), or a sampler that "
            "mixes the classes).", cause="unshuffled_data",
            evidence={"field": name, "labels": [list(r) for r in narrow[-8:]],
                      "batches": len(narrow), "span": span})

    def state_dict(self) -> dict[str, Any]:
        return {"ranges": {k: [list(r) for r in v] for k, v in self.ranges.items()},
                "told": self.told}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ranges = {str(k): deque(((int(lo), int(hi), bool(fired)) for lo, hi, fired in v),
                                     maxlen=KEPT)
                       for k, v in state.get("ranges", {}).items()}
        self.told = bool(state.get("told", False))
