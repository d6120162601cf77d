"""How often the heavy probes run: every `probes.sample_every` steps, further apart when that
costs more than `probes.sample_budget` of the run's time.

A sampled step runs the weight, update, activation, output and optimizer-state probes and
inspects the batch, and the step after it reads their results: together they cost a fixed few
milliseconds of host work, whatever the model. Against a GPT-2 step of a second that is nothing;
against a small model's 2 ms step (where people try the Guard first) it was more than every other
probe together (every 50th step of `benchmarks/overhead.py`'s MLP cost about 10 ms more, 0.2 ms
per step spread over the run). So the interval in force is the shortest of `sample_every` times
`MULTIPLES` at which

    extra_seconds / (interval * step_seconds) <= budget

where `step_seconds` is the wall time of a step that is not sampled (between two calls of the
schedule: data, forward, backward, the Guard and the optimizer) and `extra_seconds` what a sampled
step and the step after it take beyond two of those. Both are measured on the run: the step time
as a slow moving average (a step far above it, an evaluation or a checkpoint between two steps,
enters capped), the extra as the least of the last `EXTRA_KEPT` measurements (a pause adds to one
of them). The multiples are few and coarse and the choice is made once per sampled step, so the
cadence does not flicker with timing noise; sampled steps stay on multiples of `sample_every`.

What does not change: the first `EARLY_STEPS` steps of a run (or its first `EARLY_SAMPLES`
samples, whichever is longer) are sampled every `sample_every` steps whatever it costs (fine-tunes
break early), the step after any event is sampled, and a run sampled every step or every other
step keeps that cadence (it has no unsampled step to measure the samples against).
`sample_budget=None` (and every run under
torch.distributed, whose ranks must sample the same steps) samples every `sample_every` steps
exactly. Cost: one clock read and a few float operations per step.
"""

from __future__ import annotations

import math
import time
from collections import deque

MULTIPLES = (1, 2, 4, 8)
"""The intervals in force, as multiples of `sample_every`, shortest first."""
EARLY_STEPS = 500
"""The steps at the start of a run sampled every `sample_every` steps whatever it costs..."""
EARLY_SAMPLES = 10
"""...or the samples, whichever is longer."""
EXTRA_KEPT = 3
"""The last measurements of a sample's extra time the least is taken of."""
SMOOTHING = 0.05
"""The step time's moving average: a few tens of steps."""
CAP = 4.0
"""A step above this many times the average enters it at this many times."""


class SampleCadence:
    """`budget=None`: every `every` steps, always."""

    def __init__(self, every: int, budget: float | None) -> None:
        self.every = every
        self.budget = budget
        self.multiple = 1
        """The interval in force over `every`."""
        self.step_s: float | None = None
        """The moving average of an unsampled step's wall time."""
        self.extras: deque[float] = deque(maxlen=EXTRA_KEPT)
        """What the last samples took beyond two unsampled steps (seconds)."""
        self._clock: float | None = None
        self._sampled_s: float | None = None
        """The wall time of a sampled step, waiting for the step after it."""
        self.samples: deque[int] = deque(maxlen=4)
        """The last steps that ran the heavy probes (by the schedule or after an event)."""

    def interval(self, step: int) -> int:
        """The steps between two scheduled samples at `step`."""
        if step < max(EARLY_STEPS, EARLY_SAMPLES * self.every):
            return self.every
        return self.every * self.multiple

    def scheduled(self, step: int) -> bool:
        """Whether the schedule samples `step`."""
        return step % self.interval(step) == 0

    def ran(self, step: int) -> None:
        """`step` runs the heavy probes."""
        if not self.samples or self.samples[-1] != step:
            self.samples.append(step)

    def before(self, step: int) -> int:
        """The last step before `step` that ran the heavy probes (what a fault they find at
        `step` went bad since); `step - sample_every` before any."""
        earlier = [s for s in self.samples if s < step]
        return earlier[-1] if earlier else step - self.every

    def load(self, multiple: object) -> None:
        """The interval in force a checkpoint kept (under a budget; one it does not know of is
        the shortest)."""
        known = type(multiple) is int and multiple in MULTIPLES
        self.multiple = multiple if self.budget is not None and known else 1  # type: ignore[assignment]

    def restart(self) -> None:
        """The run's state was loaded: the time until the next step is no step's."""
        self._clock, self._sampled_s = None, None

    def observe(self, sampled: bool) -> None:
        """A step ended (`sampled`: whether it ran the heavy probes); called once per step, as
        the next one is scheduled."""
        if self.budget is None:
            return
        now = time.perf_counter()
        clock, self._clock = self._clock, now
        if clock is None:
            return
        took = now - clock
        if not took > 0.0:
            return
        pending, self._sampled_s = self._sampled_s, None
        if sampled:  # (a sample right after a sample leaves the first one unmeasured)
            self._sampled_s = took
        elif pending is not None:  # the step after a sample: their extra, once steps are known
            if self.step_s is not None:
                self.extras.append(max(0.0, pending + took - 2.0 * self.step_s))
                self._choose()
        else:
            average = self.step_s
            self.step_s = (took if average is None
                           else (1 - SMOOTHING) * average + SMOOTHING * min(took, CAP * average))

    def _choose(self) -> None:
        budget, step_s = self.budget, self.step_s
        assert budget is not None and step_s is not None
        extra = min(self.extras)
        if not math.isfinite(extra):
            return
        for multiple in MULTIPLES:
            if extra <= budget * multiple * self.every * step_s:
                self.multiple = multiple
                return
        self.multiple = MULTIPLES[-1]
