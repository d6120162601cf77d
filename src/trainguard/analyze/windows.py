"""A long log kept in bounded memory: consecutive rows summed up in windows.

A reader keeps every row of a log of up to `2 * MAX_ROWS` rows as it is. Past that, each two
neighbouring rows become one window, and every later window holds as many of the log's rows as
the first ones: the log is read as if it had been written every `stride` rows, which is what
the detectors' thresholds already allow for (`trainguard.analyze.sparse`: a logged mean of
`interval` steps). So a reader's memory, and the time of the replay after it, stop growing
with the log's length; only the reading does.

A window holds, of its rows:

    a loss, or any other value    the mean (a NaN or inf among them is the window's value: the
                                  mean of values holding a NaN is NaN; nothing hides a NaN)
    the gradient norm             the largest (NaN if any was: a spike is not averaged away)
    the loss scale                the smallest (a halving is kept)
    the learning rate             the last (the scheduler's value where the window ends)
    skipped                       when half its rows or more were skipped

Its step is that of its first row whose loss is not finite, else of its last row, so the onset
of a NaN is the step the log first shows it at; its name spans its rows (`iter 1000 to iter
1063`). The log says how many rows each window holds (a note).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

MEAN, LAST, LARGEST, SMALLEST = "mean", "last", "largest", "smallest"
"""How a window sums up a value of its rows (the reader names the value of each rule)."""

MAX_ROWS = 1 << 16
"""Rows kept as they are: a log of more than twice this many is summed up in windows."""
MAX_EVALS = 1 << 14
"""Evaluations kept as they are: past twice this many, two neighbours become one (the mean of
each metric, at the later step)."""


@dataclass(slots=True)
class Window:
    """Rows of a log summed up: the values as above, and what the summary needs to go on."""

    values: dict[str, float]
    counts: dict[str, int] = field(default_factory=dict)
    """Per value, how many rows held it (the weight of its mean)."""
    rows: int = 1
    skips: int = 0
    step: int = 0
    first: tuple[int, str] = (0, "")
    """The first row's step and label."""
    last: tuple[int, str] = (0, "")

    def absorb(self, other: Window, rules: Mapping[str, str], loss: str) -> None:
        """`other`, the rows right after these, taken into this window: each value by its rule
        in `rules` (else `MEAN`); `loss` names the loss, whose first non-finite value gives the
        window its step."""
        if not _nonfinite(self.values.get(loss)):
            self.step = other.step
        for name, value in other.values.items():
            weight = other.counts.get(name, 1)
            if name not in self.values:
                self.values[name] = value
                self.counts[name] = weight
                continue
            held = self.values[name]
            rule = rules.get(name, MEAN)
            if rule == LAST:
                self.values[name] = value
            elif rule in (LARGEST, SMALLEST):
                self.values[name] = _extreme(held, value, largest=rule == LARGEST)
            else:
                mine = self.counts.get(name, 1)
                self.values[name] = (held * mine + value * weight) / (mine + weight)
            self.counts[name] = self.counts.get(name, 1) + weight
        self.rows += other.rows
        self.skips += other.skips
        self.last = other.last

    def skipped(self) -> bool:
        return 2 * self.skips >= self.rows


def row(values: Mapping[str, float], step: int, label: str, skipped: bool) -> Window:
    """One row of the log as a window of one."""
    return Window(values=dict(values), step=step, skips=int(skipped), first=(step, label),
                  last=(step, label))


def halve(windows: list[Window], rules: Mapping[str, str], loss: str) -> list[Window]:
    """Each two neighbouring windows as one (a last one without a neighbour kept)."""
    out: list[Window] = []
    for at in range(0, len(windows) - 1, 2):
        windows[at].absorb(windows[at + 1], rules, loss)
        out.append(windows[at])
    if len(windows) % 2:
        out.append(windows[-1])
    return out


def label(window: Window, unit: str) -> str:
    """The rows a window holds, as the log names them: `iter 1000 to iter 1063`."""

    def name(step: int, label: str) -> str:
        return label or f"{unit} {step}"

    if window.rows == 1:
        return name(*window.last)
    return f"{name(*window.first)} to {name(*window.last)}"


def note(rows: int, stride: int) -> str:
    """What the log's notes say of its windows."""
    return (f"the log's {rows} rows are read in windows of {stride} consecutive rows (more "
            f"than {2 * MAX_ROWS} are not kept one by one): the mean loss of each, its largest "
            "gradient norm, its last learning rate")


EVALS_NOTE = (f"more than {2 * MAX_EVALS} evaluations: neighbouring ones are read as one, the "
              "mean of each metric")


def halve_evals(evals: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    """Each two neighbouring evaluations (by step) as one, at the later step: each metric the
    mean of those that hold it."""
    ordered = sorted(evals.items())
    out: dict[int, dict[str, float]] = {}
    for at in range(0, len(ordered), 2):
        pair = ordered[at:at + 2]
        merged: dict[str, list[float]] = {}
        for _, metrics in pair:
            for name, value in metrics.items():
                merged.setdefault(name, []).append(value)
        out[pair[-1][0]] = {name: sum(values) / len(values) for name, values in merged.items()}
    return out


def _nonfinite(value: float | None) -> bool:
    return value is not None and not math.isfinite(value)


def _extreme(a: float, b: float, *, largest: bool) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b) if largest else min(a, b)
