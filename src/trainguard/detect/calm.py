"""A whole log's signals as columns, for the detectors' offline fast path (`Detector.skip_calm`).

Live, a detector sees one step at a time. Over a log, most rows are calm: the detector raises
nothing and its state moves as it always does on such a row (a baseline admits the value, a
counter stays at 0). `SignalColumns` holds the rows a detector is handed, one array per
`StepSignals` field; a detector's `skip_calm` finds, with array operations, where its calm rows
end and brings its state past them exactly as `check` row by row would, so that `check` runs only
on the rows where something may happen. Values the detectors compare are computed as `check`
computes them (`math.log`, the same medians), so the fast path decides as the slow one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

if TYPE_CHECKING:
    from trainguard.events import Event
    from trainguard.signals import RobustBaseline, StepSignals, TransientJumps

CHUNK_ELEMENTS = 1 << 22
"""The most values one step of a fast path sorts at once (windows x window length): its memory
stays bounded whatever the log's length."""


@dataclass(slots=True)
class SignalColumns:
    """The signals of the rows a detector is handed, as arrays over those rows (position `i` is
    the `i`-th row handed, `step[i]` its `StepSignals.step`)."""

    step: np.ndarray
    loss: np.ndarray
    """float64; NaN where the row holds no loss (`has_loss`)."""
    has_loss: np.ndarray
    grad_norm: np.ndarray
    """float64; 0.0 where the row holds none (as `StepSignals.grad_norm`)."""
    amp_overflow: np.ndarray
    group_lrs: np.ndarray
    """float64, rows x parameter groups (NaN where a group has no LR at a row)."""
    has_lr: np.ndarray
    """Rows whose `group_lrs` is not empty."""
    loss_curvature: np.ndarray
    """float64; NaN where None (`has_curvature`)."""
    has_curvature: np.ndarray
    _memo: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.step)

    def log_loss(self) -> np.ndarray:
        """`safe_log` of each row's loss (NaN where none), as `check` computes it."""
        if "log_loss" not in self._memo:
            self._memo["log_loss"] = _safe_logs(self.loss)
        return self._memo["log_loss"]

    def log_grad_norm(self) -> np.ndarray:
        if "log_grad_norm" not in self._memo:
            self._memo["log_grad_norm"] = _safe_logs(self.grad_norm)
        return self._memo["log_grad_norm"]

    def next_of(self, name: str, where: np.ndarray, start: int, end: int) -> int:
        """The first position in [start, end) where the mask `where` (cached as `name`: it
        must be the same mask at every call) holds; `end` when none does."""
        found = self._memo.get(name)
        if found is None:
            found = self._memo[name] = np.flatnonzero(where)
        at = int(np.searchsorted(found, start))
        return min(int(found[at]), end) if at < len(found) else end

    def chunk(self, start: int, end: int, window: int) -> int:
        """Where a fast path that sorts windows of `window` values stops looking, before
        `end`: its memory stays bounded whatever the log's length."""
        return min(end, start + max(CHUNK_ELEMENTS // max(window, 1), 1))


def _safe_logs(values: np.ndarray) -> np.ndarray:
    """`safe_log` of each value: with `math.log`, not `np.log`, whose last bit may differ, for
    the fast path compares the very values `check` computes."""
    out = np.full(len(values), math.nan)
    out[values == 0.0] = -math.inf
    positive = finite_positive(values)
    out[positive] = list(map(math.log, values[positive].tolist()))
    return out


def window_medians(history: np.ndarray, values: np.ndarray, window: int, *,
                   including: bool) -> np.ndarray:
    """The median of the `window` values before each of `values` (or up to and `including` it),
    `history` (at least `window` values) coming before them; as `statistics.median` and
    `RobustBaseline.median` compute it (the middle value, or half the sum of the middle two)."""
    seen = np.concatenate([history[len(history) - window:], values])
    ordered = np.sort(sliding_window_view(seen, window)[int(including):][:len(values)], axis=1)
    if window % 2:
        return ordered[:, window // 2].copy()
    return 0.5 * (ordered[:, window // 2 - 1] + ordered[:, window // 2])


def first_true(mask: np.ndarray) -> int:
    """The index of the first True of `mask`, its length when none."""
    found = np.flatnonzero(mask)
    return int(found[0]) if len(found) else len(mask)


def pass_calm_jumps(baseline: RobustBaseline, transients: TransientJumps, values: np.ndarray,
                    judged: np.ndarray, stop: int, start: int, end: int) -> int:
    """The end of the calm stretch of a jump detector (`loss_spike`, `grad_explosion`): the
    row of the first judged value that may jump (`stop`, an index into `values`), or `end`; the
    calm values before it enter the baseline, and the transient jumps are back to normal."""
    if stop < len(values):
        end = start + int(np.flatnonzero(judged)[stop])
    if stop:
        baseline.admit_all(values[:stop], stats_first=True)
        transients.back_to_normal()
    return end


def finite_positive(values: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.isfinite(values) & (values > 0)


FAST_FIRST = 64
"""Rows a detector's fast path first looks ahead over (`Detector.skip_calm`); the stretch
doubles while every row it looks at is calm, and starts again from this after a row that is not."""
FAST_GAIN = 8
"""A fast path that skipped fewer rows than this is not tried again for as many rows as it has
failed in a row (up to `FAST_WAIT`): in a log of few calm rows in a row, its array work would
cost more than `check` on each row."""
FAST_WAIT = 64


class RowJudge(Protocol):
    """What `run_rows` asks of a detector (`Detector`, which imports this module)."""

    def skip_calm(self, columns: SignalColumns, start: int, end: int) -> int: ...

    def check(self, signals: StepSignals) -> list[Event]: ...


def run_rows(detector: RowJudge, columns: SignalColumns,
             fill: Callable[[int], tuple[int, StepSignals]], *,
             fast: bool = True) -> list[tuple[int, Event]]:
    """One detector over its rows, a log's or the calm lane's (`fill(position)`: the row of a
    position of `columns`, and its signals): `skip_calm` past the calm ones, `check` on the
    others; (row, event) in the order it raised them."""
    found: list[tuple[int, Event]] = []
    position, count = 0, len(columns)
    ahead, retry, failed = FAST_FIRST, 0, 0
    while position < count:
        if fast and position >= retry:
            end = min(count, position + ahead)
            skipped_to = detector.skip_calm(columns, position, end)
            ahead = ahead * 2 if skipped_to == end else FAST_FIRST
            failed = 0 if skipped_to - position >= FAST_GAIN else min(failed + 1, FAST_WAIT)
            retry = skipped_to + failed
            position = skipped_to
            if position >= count or position == end:
                continue
        row, signals = fill(position)
        found.extend((row, event) for event in detector.check(signals))
        position += 1
    return found
