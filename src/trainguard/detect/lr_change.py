"""`lr_change`: a parameter group's learning rate rose far above anything it had used before.

Schedules move the LR smoothly (warmup climbs by small steps, decay falls, a restart returns to a
level already used), so a rise of `detectors.lr_change.ratio` (3x) above the highest LR a group ever
had, in one step, is someone's code changing it: a multiplier applied by the training loop, a
wrongly configured restart, a scheduler stepped per batch instead of per epoch. A group's first
`warmup_steps` LRs only set its history (a warmup from a tiny start factor rises 10x in its
first step). A group added mid-run (a block unfrozen with `add_param_group`) whose first LR is
`detectors.lr_change.ratio` above the highest LR any group had used counts the same way: the head's
LR handed to a pre-trained block. The event is `info`: a
deliberate change is not a fault by itself. It is evidence: trouble that follows within the next
steps ranks `lr_too_high` first, naming the change ("LR x1000 at step 60").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from trainguard.detect.base import Detector
from trainguard.detect.calm import SignalColumns, finite_positive, first_true
from trainguard.detect.settings import DetectorConfig
from trainguard.events import Event
from trainguard.signals import StepSignals


class LRChange(Detector):
    kind = "lr_change"
    budget_us = 12.0  # every group's LR against its recent history
    reads = frozenset({"group_lrs", "lr_managed"})

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.highest: list[float] = []
        """The highest LR each group has used so far (0 before its first positive LR)."""
        self.previous: list[float] = []
        self.seen: list[int] = []
        """Positive LRs each group has used so far."""

    def check(self, signals: StepSignals) -> list[Event]:
        jumps: list[tuple[int, float, float, float]] = []  # group, lr, before, highest
        added: list[tuple[int, float, float]] = []  # group, lr, the highest of the others
        settled_before = any(seen >= self.config.common.warmup_steps for seen in self.seen)
        top_before = max(self.highest, default=0.0)
        for group, lr in enumerate(signals.group_lrs):
            if group >= len(self.highest):  # a group added mid-run starts its own history
                self.highest.append(0.0)
                self.previous.append(0.0)
                self.seen.append(0)
                if (settled_before and top_before > 0 and math.isfinite(lr)
                        and lr >= self.config.lr_change.ratio * top_before
                        and not signals.lr_managed):
                    added.append((group, lr, top_before))
            if not math.isfinite(lr) or lr <= 0:
                continue
            top = self.highest[group]
            settled = self.seen[group] >= self.config.common.warmup_steps
            if (settled and top > 0 and lr >= self.config.lr_change.ratio * top
                    and not signals.lr_managed):  # trainguard's own backoff is no news
                jumps.append((group, lr, self.previous[group], top))
            self.highest[group] = max(top, lr)
            self.previous[group] = lr
            self.seen[group] += 1
        if added and not jumps:
            group, lr, top = max(added, key=lambda a: a[1])
            groups = [a[0] for a in added]
            return [self.event(
                signals.step, "info",
                f"a parameter group added at step {signals.step} (group {group}) starts at LR "
                f"{lr:.3g}, {_times(lr / top)}x the highest any group had used ({top:.3g})",
                value=lr, ratio=lr / top, previous=0.0, highest=top, groups=groups,
                added=True)]
        if not jumps:
            return []
        # one event for the step; groups that moved together (a multiplier applied to all)
        # are named together, with the largest rise
        group, lr, before, top = max(jumps, key=lambda j: j[1] / j[3])
        ratio = lr / before if before > 0 else lr / top
        groups = [j[0] for j in jumps]
        where = ""
        if len(signals.group_lrs) > 1:
            where = (f" (group {group})" if len(groups) == 1
                     else f" (groups {', '.join(map(str, groups))})")
        return [self.event(
            signals.step, "info",
            f"LR x{_times(ratio)} at step {signals.step}{where}: {before:.3g} -> {lr:.3g}, "
            f"{_times(lr / top)}x the highest it had been",
            value=lr, ratio=ratio, previous=before, highest=top, groups=groups)]

    def skip_calm(self, columns: SignalColumns, start: int, end: int) -> int:
        """Calm rows: no LR, or every group's LR under `ratio` times the highest it had (or
        within its first `warmup_steps` LRs). The state follows from the LRs alone: the highest
        and the last positive LR of each group, and how many it had."""
        lrs = columns.group_lrs
        if not len(self.highest) or lrs.shape[1] != len(self.highest):
            return start  # the groups are not all known yet: `check` adds them
        end = columns.chunk(start, end, lrs.shape[1])
        given = columns.has_lr[start:end]
        rows = lrs[start:end][given]
        used = finite_positive(rows)
        highest = np.maximum.accumulate(np.vstack([self.highest, np.where(used, rows, 0.0)]))
        seen = np.vstack([self.seen, np.cumsum(used, axis=0) + self.seen])
        settled = seen[:-1] >= self.config.common.warmup_steps
        top = highest[:-1]
        with np.errstate(invalid="ignore"):
            rise = used & settled & (top > 0) & (rows >= self.config.lr_change.ratio * top)
        stop = first_true(rise.any(axis=1))
        if stop < len(rows):
            end = start + int(np.flatnonzero(given)[stop])
        if stop:
            taken = used[:stop]
            last = np.where(taken.any(axis=0),
                            rows[:stop][np.maximum(stop - 1 - np.argmax(taken[::-1], axis=0), 0),
                                        np.arange(rows.shape[1])], self.previous)
            self.highest = highest[stop].tolist()
            self.previous = last.tolist()
            self.seen = seen[stop].astype(int).tolist()
        return end

    def state_dict(self) -> dict[str, Any]:
        return {"highest": list(self.highest), "previous": list(self.previous),
                "seen": list(self.seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.highest = [float(v) for v in state["highest"]]
        self.previous = [float(v) for v in state["previous"]]
        self.seen = [int(v) for v in state["seen"]]


def _times(ratio: float) -> str:
    """1000 rather than 1e+03: how people say a multiplier."""
    return f"{ratio:.0f}" if 10 <= ratio < 1e6 else f"{ratio:.3g}"
