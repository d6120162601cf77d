"""Learning-rate backoff after a rollback: a factor on top of whatever sets the LR, under a ceiling.

After a rollback each parameter group's LR is

    max(ramp x min(schedule, ceiling), min(schedule, floor))

where `schedule` is the LR the run would have without recovery (its scheduler's, or the one the
loop writes), `ramp` goes linearly from `start` back to 1 over `ramp_steps` applied updates, and
`ceiling` is an LR value below the one in force when the trouble began: the ramp never climbs
back to the LR that failed. `floor` (an LR value, or none) is the LR the ramp starts from while
the schedule is still at or above the ceiling (`start` x the ceiling): the cut never goes below
it, so a schedule already under it (the loop put back the LR it had raised) is not cut, and the
cut comes back only while the schedule is up there again. The factor
this puts on a group's LR is applied by scaling both the group's LR and the schedulers'
`base_lrs` (`scale_learning_rate`), so it survives closed-form schedulers (LambdaLR and friends
recompute the LR from `base_lrs`) and chainable ones (which start from the current LR) alike,
whoever calls `scheduler.step()`: the plain-loop Guard or a framework trainer.

A loop that writes `param_group["lr"]` itself every step overwrites the factor. `enforce`, called
when the step is measured (before its LR is read and before the update), finds a group whose LR is
no longer the value the backoff left, takes the new value as the schedule's and puts the factor
and the ceiling back on it. A learning rate kept as a tensor (capturable optimizers) is not read
there, which would be a device sync: its factor follows by ratios, and its ceiling is checked with
the LR the step's one transfer brought (`observe`), before the update.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from trainguard.errors import UsageError


def set_lr(group: dict[str, Any], value: Any) -> None:
    current = group["lr"]
    if isinstance(current, torch.Tensor):  # capturable optimizers keep the LR as a tensor
        current.copy_(value)
    else:
        group["lr"] = value


WHOLE = 1e-9
"""Relative error within which a ratio of two LRs is a whole number: a loop's `lr /= 100` is
the value it read divided by 100 to the last bits, an LR it writes itself is not."""


def scaling(read: float, written: float) -> float | None:
    """written / read where one is the other times a whole number of 2 or more (the loop
    scaled the LR it read), else None."""
    if not (read > 0 and written > 0 and math.isfinite(read) and math.isfinite(written)):
        return None
    ratio = written / read
    whole = ratio if ratio >= 1 else 1 / ratio
    nearest = round(whole)
    return ratio if nearest >= 2 and abs(whole - nearest) <= WHOLE * whole else None


def _check_factor(factor: Any) -> None:
    if (not isinstance(factor, (int, float)) or isinstance(factor, bool)
            or not math.isfinite(factor) or not factor > 0):
        raise UsageError(f"the learning-rate factor must be a finite number > 0, got {factor!r}")


def scale_learning_rate(optimizer: torch.optim.Optimizer, schedulers: Iterable[Any],
                        factor: float | Sequence[float]) -> None:
    """Multiply the learning rate by `factor` (one for every group, or one per group) so that the
    change survives the next scheduler step.

    `LambdaLR` (and every closed-form scheduler) recomputes lr = base_lr * f(step) from its
    `base_lrs`, so changing `param_groups` alone is undone at the next step: scale both, and the
    `initial_lr` a resumed scheduler rebuilds its base from.
    """
    groups = optimizer.param_groups
    if isinstance(factor, (list, tuple)):
        factors = list(factor)
        if len(factors) != len(groups):
            raise UsageError(f"one learning-rate factor per parameter group: got {len(factors)} "
                             f"for {len(groups)} groups")
    else:
        factors = [factor] * len(groups)
    for f in factors:
        _check_factor(f)
    for group, f in zip(groups, factors, strict=True):
        if f != 1.0:
            set_lr(group, group["lr"] * f)
            if "initial_lr" in group:
                group["initial_lr"] = group["initial_lr"] * f
    for scheduler in schedulers:
        for name in ("base_lrs", "_last_lr"):
            values = getattr(scheduler, name, None)
            if isinstance(values, list) and len(values) == len(factors):
                setattr(scheduler, name, [v * f for v, f in zip(values, factors, strict=True)])


class LRBackoff:
    """The factor recovery puts on every parameter group's LR. Group i's LR is `applied[i]` x the
    schedule's, with `applied[i] = max(ramp() x shares[i], lifts[i])`: `shares[i] = min(1,
    ceilings[i] / schedule)` keeps it under its ceiling (an LR value; None: none), and
    `lifts[i] = min(1, floors[i] / schedule)` keeps the ramp from cutting it below its floor (an
    LR value; None: none)."""

    def __init__(self, optimizers: list[torch.optim.Optimizer], schedulers: list[Any],
                 ramp_steps: int) -> None:
        self.optimizers = optimizers
        self.schedulers = schedulers
        """Scaled with the first optimizer's groups (a scheduler drives one optimizer)."""
        self.ramp_steps = ramp_steps
        self.start = 1.0
        self.progress = 0
        self.active = False
        self.ceilings: list[float | None] = []
        self.applied: list[float] = []
        self.shares: list[float] = []
        self.floors: list[float | None] = []
        self.lifts: list[float] = []
        self._left: list[float | None] = []
        """The LR each group was left at (None for a tensor LR, which `enforce` does not read)."""
        self._groups()

    def _groups(self) -> list[dict[str, Any]]:
        """Every optimizer's parameter groups, with a place in every per-group list (a group
        added mid-run starts with no ceiling and no factor)."""
        groups = [g for opt in self.optimizers for g in opt.param_groups]
        missing = len(groups) - len(self.applied)
        if missing > 0:
            self.ceilings.extend([None] * missing)
            self.applied.extend([1.0] * missing)
            self.shares.extend([1.0] * missing)
            self.floors.extend([None] * missing)
            self.lifts.extend([0.0] * missing)
            self._left.extend([None] * missing)
        return groups

    def ramp(self) -> float:
        """The ramp's share of the schedule now (1.0 when no backoff is on)."""
        if not self.active or self.ramp_steps == 0 or self.progress >= self.ramp_steps:
            return 1.0
        return self.start + (1.0 - self.start) * self.progress / self.ramp_steps

    def factor(self) -> float:
        """The factor on the first group's LR now (1.0 when no backoff is on)."""
        return self.applied[0] if self.active and self.applied else 1.0

    def ceiling(self) -> float | None:
        """The first group's LR ceiling (None: none)."""
        return self.ceilings[0] if self.ceilings else None

    def begin(self, start: float, ceilings: Sequence[float | None],
              applied: Sequence[float], floors: Sequence[float | None] | None = None) -> None:
        """Start a backoff: the ramp from `start`, under `ceilings` (one LR value per group, None
        for none), never cutting a group's schedule below its entry of `floors` (an LR value,
        None for none; no floors: none). `applied` is the factor the current learning rates
        already carry (that of a restored state taken during an earlier backoff)."""
        groups = self._groups()
        floors = [None] * len(groups) if floors is None else list(floors)
        if len(ceilings) != len(groups) or len(applied) != len(groups) \
                or len(floors) != len(groups):
            raise UsageError(f"one ceiling, floor and factor per parameter group ({len(groups)})")
        self.start, self.progress, self.active = start, 0, True
        self.ceilings = list(ceilings)
        self.applied = [float(a) for a in applied]
        self.shares = [1.0] * len(groups)
        self.floors = floors
        self.lifts = [0.0] * len(groups)
        self._follow(groups)

    def ceilings_now(self) -> list[float | None]:
        """Every group's ceiling (None: none), one per parameter group as they are now."""
        self._groups()
        return list(self.ceilings)

    def step(self) -> None:
        """After the scheduler step of an applied update: move the ramp on by one step and keep
        the new schedule's LR under the ceiling."""
        if not self.active:
            return
        self.progress += 1
        self._follow(self._groups())
        if self.progress >= self.ramp_steps and all(c is None for c in self.ceilings):
            self.active = False  # fully back on the plain schedule: nothing more to do per step

    def enforce(self) -> list[str]:
        """Before the step's LR is read and used: a group whose LR is no longer the value the
        backoff left was set by the loop. That value is the schedule's, without the factor: put
        the factor and the ceiling back on it (and on the schedulers' bases, which carried the
        old factor). The LR is never put above the value the loop wrote. Returns, one line per
        group, where the value written is the one left times or divided by a whole number
        (`lr /= 100`): a loop that scales the LR it reads scales the cut too, which the run
        then keeps (it cannot tell `lr /= 100` from a value meant as such), so it is said."""
        if not self.active:
            return []
        groups = self._groups()
        overwritten = [i for i, g in enumerate(groups) if not isinstance(g["lr"], torch.Tensor)
                       and self._left[i] is not None and g["lr"] != self._left[i]]
        said = []
        for i in overwritten:
            left, written = self._left[i], float(groups[i]["lr"])
            ratio = scaling(left, written) if left is not None else None
            if ratio is not None and self.applied[i] < 1.0:
                meant = written / self.applied[i]
                said.append(
                    f"the loop set group {i}'s LR to {written:.3g}, x{ratio:.3g} the "
                    f"{left:.3g} it read while trainguard held it at x{self.applied[i]:.3g} of "
                    f"the schedule: taken as the schedule's LR from here. If the loop "
                    f"scaled the LR it read (lr *= or /=), it scaled trainguard's cut too: x"
                    f"{ratio:.3g} the schedule is {meant:.3g}; write the LR itself "
                    "(param_group['lr'] = value) while the cut is on")
            self._rescale_schedulers(i, 1.0 / self.applied[i])
            self.applied[i] = 1.0
        if overwritten:
            self._follow(groups)
        return said

    def observe(self, lrs: Sequence[float]) -> None:
        """With the LR of every group as the step's transfer brought it, before the update: keep
        the groups whose LR is a tensor (not read on the host otherwise) under their ceilings."""
        groups = self._groups()
        if self.active and len(lrs) == len(groups) and any(
                isinstance(g["lr"], torch.Tensor) and c is not None
                for g, c in zip(groups, self.ceilings, strict=True)):
            self._follow(groups, host=lrs)

    def _follow(self, groups: list[dict[str, Any]], host: Sequence[float] | None = None) -> None:
        """Bring every group to max(ramp x min(schedule, ceiling), min(schedule, floor))."""
        ramp = self.ramp()
        ratios = []
        for i, group in enumerate(groups):
            lr = group["lr"]
            value = host[i] if isinstance(lr, torch.Tensor) and host is not None else (
                None if isinstance(lr, torch.Tensor) else float(lr))
            ceiling, floor = self.ceilings[i], self.floors[i]
            schedule = (value / self.applied[i] if value is not None and math.isfinite(value)
                        else None)  # unknown: the group keeps its share and lift
            if ceiling is None:
                self.shares[i] = 1.0
            elif schedule is not None:
                self.shares[i] = ceiling / schedule if schedule > ceiling else 1.0
            if floor is None:
                self.lifts[i] = 0.0
            elif schedule is not None:
                self.lifts[i] = min(1.0, floor / schedule) if schedule > 0 else 1.0
            # a tensor LR keeps its share and lift until observed again
            target = max(ramp * self.shares[i], self.lifts[i])
            ratios.append(target / self.applied[i])
            self.applied[i] = target
        self._rescale(ratios)
        self._left = [None if isinstance(g["lr"], torch.Tensor) else float(g["lr"])
                      for g in groups]

    def _rescale(self, ratios: list[float]) -> None:
        if all(r == 1.0 for r in ratios):
            return
        start = 0
        for i, optimizer in enumerate(self.optimizers):  # each scheduler is scaled once
            count = len(optimizer.param_groups)
            scale_learning_rate(optimizer, self.schedulers if i == 0 else [],
                                ratios[start:start + count])
            start += count

    def _rescale_schedulers(self, index: int, ratio: float) -> None:
        """Scale group `index`'s entry of the schedulers' bases only."""
        first = len(self.optimizers[0].param_groups) if self.optimizers else 0
        if index >= first or ratio == 1.0:
            return
        for scheduler in self.schedulers:
            for name in ("base_lrs", "_last_lr"):
                values = getattr(scheduler, name, None)
                if isinstance(values, list) and len(values) == first:
                    values = list(values)
                    values[index] = values[index] * ratio
                    setattr(scheduler, name, values)

    def state_dict(self) -> dict[str, Any]:
        return {"start": self.start, "progress": self.progress, "active": self.active,
                "ceilings": list(self.ceilings), "applied": list(self.applied),
                "shares": list(self.shares), "floors": list(self.floors),
                "lifts": list(self.lifts), "left": list(self._left)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start = float(state["start"])
        self.progress = int(state["progress"])
        self.active = bool(state["active"])
        count = len([g for opt in self.optimizers for g in opt.param_groups])
        if "applied" not in state:  # saved when the ceiling was a factor on the schedule
            self.ceilings, self.shares, self._left = [None] * count, [1.0] * count, [None] * count
            self.floors, self.lifts = [None] * count, [0.0] * count
            ceiling = float(state.get("ceiling", 1.0))
            done = min(1.0, self.progress / self.ramp_steps) if self.ramp_steps else 1.0
            factor = self.start + (ceiling - self.start) * done
            self.applied = [factor if self.active else 1.0] * count
            return
        self.ceilings = [None if c is None else float(c) for c in state["ceilings"]]
        self.applied = [float(a) for a in state["applied"]]
        self.shares = [float(v) for v in state["shares"]]
        self._left = [None if v is None else float(v) for v in state["left"]]
        # saved before floors existed: none
        self.floors = [None if v is None else float(v)
                       for v in state.get("floors", [None] * len(self.shares))]
        self.lifts = [float(v) for v in state.get("lifts", [0.0] * len(self.shares))]
