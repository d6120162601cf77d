"""The same batch at every step: a loader re-created inside the loop, or full-batch training.

`batch = next(iter(loader))` inside the training loop builds a new iterator at each step; without
`shuffle=True` it returns the loader's first batch every time, and the run trains on that one
batch: its loss falls towards 0 as the model memorises it, and nothing fails. Full-batch
training (a small tabular set, a physics-informed network's fixed collocation points) does the
same on purpose, so this is an info, stated as a fact of the run, not a fault.

Seen from the batch inspector's statistics (`FieldStats`: every field's shape, range, mean,
spread and a checksum that weighs each value by its place) of the first `STEPS` steps in a row,
inspected for it: the same to the last digit in every field. Two different batches agree so in
no field that varies, the same values shuffled (a sorting task's rows, balanced one-hot codes)
included. Compared
step after step, not at the sampled steps far apart (a loader of 50 batches an epoch gives the
same batch at steps 0, 50 and 100, each step training on its own). Told at most once per run,
and only on the run's first steps.
"""

from __future__ import annotations

from typing import Any

from trainguard.diagnose.batch import PADDED_LABELS, FieldStats
from trainguard.finding import Finding

STEPS = 3
"""The first steps compared: the same batch at each of them is told."""


def fingerprint(stats: list[FieldStats]) -> tuple[Any, ...]:
    """What two batches must share to be the same: each field's name, shape, range, mean,
    spread and order-sensitive checksum (the same values in another order differ there), and
    its count of non-finite values (NaN compares unequal: its count stands in)."""
    return tuple((s.name, s.shape, s.nonfinite, *(v if v == v else "nan" for v in (
        s.min, s.max, s.mean, s.std, s.checksum))) for s in stats
        if s.name.rsplit(".", 1)[-1] != PADDED_LABELS)


class BatchRepeat:
    """Whether the first steps' batches are one batch (`watching` while it is not known)."""

    def __init__(self) -> None:
        self.first: tuple[Any, ...] | None = None
        self.steps: list[int] = []
        self.watching = True
        """The next batch is compared (its statistics are needed)."""

    def observe(self, stats: list[FieldStats], step: int) -> Finding | None:
        """The finding when the first `STEPS` steps' batches are the same; None otherwise."""
        if not self.watching:
            return None
        seen = fingerprint(stats)
        if not seen:  # no tensor to compare
            self.watching = False
            return None
        if self.first is None:
            self.first, self.steps = seen, [step]
            return None
        if seen != self.first or step != self.steps[-1] + 1:
            self.watching = False  # different data, or not step after step
            return None
        self.steps.append(step)
        if len(self.steps) < STEPS:
            return None
        self.watching = False
        steps = ", ".join(str(s) for s in self.steps[:-1]) + f" and {self.steps[-1]}"
        return Finding(
            "batch_repeated", "info",
            f"the batches of steps {steps} are the same (every field's shape, range, mean and "
            "spread equal): the run may train on one batch, as a loader re-created at each "
            "step gives (next(iter(loader)) inside the loop returns the loader's first batch "
            "every time without shuffle=True); full-batch training, or passes over one "
            "rollout, do so on purpose.",
            "iterate the loader once per epoch (for batch in loader:), or keep one iterator "
            "and call next() on it.",
            evidence={"steps": list(self.steps)})

    def state_dict(self) -> dict[str, Any]:
        return {"watching": False}  # a resumed run is past its first steps

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.watching = bool(state.get("watching", False))
