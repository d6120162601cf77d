"""The "no warmup" finding of a guarded run, judged on the LRs its first steps really use.

The preflight reads the LR the optimizer was built with and probes the scheduler, but a loop may
warm the LR up itself (`for g in opt.param_groups: g["lr"] = base * min(1, step / 100)` before
each step), and a loop may run at another LR than the one it built the optimizer with. So in a
guarded run the preflight's `warmup` finding is held back; the group LRs that `measure` reads
every step (host floats already) are watched over the first `watch_steps` steps:

- the LR rises above its first value: the run warms up, and the finding is dropped at once;
- it does not (constant, or decaying from its first value): the finding is judged again on the
  LRs observed (`preflight.judge_warmup`) and reported;
- the run ends before the window is full: judged on the steps it had, two at least.
"""

from __future__ import annotations

import math

from trainguard.diagnose.preflight import RunSetup, judge_warmup, run_length
from trainguard.finding import Finding

WARMUP_WATCH_STEPS = 10
"""A warmup shows from the first step to the next (any schedule that climbs, climbs there); a few
more steps let a loop that sets its LR a step late show it too."""
WARMUP_WATCH_MIN = 3
WARMUP_WATCH_SHARE = 0.02
"""On a run of known length, the window is at most this share of it (and `WARMUP_WATCH_MIN` steps
at least), so a short run's finding is known early."""
RISE = 1e-3
"""A rise of the LR above its first value by more than this share is a warmup (not rounding)."""


def watch_steps(total_steps: int | None) -> int:
    """How many steps' LRs decide the finding on a run of `total_steps` steps (None: unknown)."""
    if total_steps is None:
        return WARMUP_WATCH_STEPS
    share = math.ceil(WARMUP_WATCH_SHARE * total_steps)
    return min(WARMUP_WATCH_STEPS, max(WARMUP_WATCH_MIN, share))


class WarmupWatch:
    """Holds the `warmup` finding of `setup` until the run's first LRs decide it."""

    def __init__(self, setup: RunSetup, steps: int | None = None) -> None:
        self.setup = setup
        self.steps = steps if steps is not None else watch_steps(
            setup.total_steps or run_length(setup.scheduler))
        self.lrs: list[float] = []
        """Per observed step, the highest LR of any param group."""
        self.others: list[float] = []

    def observe(self, group_lrs: tuple[float, ...]) -> list[Finding] | None:
        """One step's LRs (per param group). None while undecided; then the findings: none if
        the LR was seen ramping, else the `warmup` finding judged on the observed LRs."""
        finite = [lr for lr in group_lrs if math.isfinite(lr)]
        if not finite:  # an LR that cannot be read says nothing
            return None
        self.lrs.append(max(finite))
        self.others.extend(finite)
        if self.lrs[-1] > self.lrs[0] * (1 + RISE):  # from 0 too
            return []
        if len(self.lrs) < self.steps:
            return None
        return self._judge()

    def settle(self) -> list[Finding]:
        """The run ended before the window was full: judged on the steps seen, if two or more
        (a single step shows no trend)."""
        return self._judge() if len(self.lrs) >= 2 else []

    def _judge(self) -> list[Finding]:
        seen = len(self.lrs)
        return judge_warmup(self.setup, self.lrs, self.others,
                            f"the first {seen} steps ran at LR {{first}}, at most {{peak}}",
                            extra={"observed_steps": seen})

