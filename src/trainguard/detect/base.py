"""The detector contract: `check(signals) -> events`, with explicit, serialisable state."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from trainguard.detect.calm import SignalColumns
from trainguard.detect.settings import DetectorConfig
from trainguard.events import Event, Severity
from trainguard.signals import StepSignals


class Episode:
    """Reports an anomaly once: fires when it starts, re-arms after `rearm_steps` calm steps."""

    def __init__(self, rearm_steps: int) -> None:
        self.rearm_steps = rearm_steps
        self.active = False
        self.calm = 0

    def update(self, anomalous: bool) -> bool:
        """True when this step starts a new episode."""
        if anomalous:
            self.calm = 0
            if self.active:
                return False
            self.active = True
            return True
        if self.active:
            self.calm += 1
            if self.calm >= self.rearm_steps:
                self.active = False
                self.calm = 0
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"active": self.active, "calm": self.calm}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.active = bool(state["active"])
        self.calm = int(state["calm"])


OUTLIER_MARK = ": the batch of step "
"""What a jump told as an outlier batch adds to the message that says what jumped."""


def as_outlier(message: str, step: int, harm: str) -> str:
    """`message` (what jumped) told as an outlier batch, with the `harm` the next step would
    show."""
    return f"{message}{OUTLIER_MARK}{step} is an outlier until the next step shows harm ({harm})"


def what_jumped(message: str) -> str:
    """The message of a jump told as an outlier batch, without the telling."""
    return message.partition(OUTLIER_MARK)[0]


@dataclass(slots=True)
class Outlier:
    """A one-step jump told as an outlier batch, until the steps after it say whether it did
    harm: where it was (`step`), the value it jumped to, the run's typical value then, and their
    ratio; `after` records, for each step since, whether its value was still up.

    It did harm when the value is still up at the very next step, or on `HARM` of the `WATCH`
    steps after it (a level that stays up, hovering around the threshold); back at its level on
    the others, it is what one heavy-tailed batch does, even when another batch of the same tail
    comes along among them."""

    WATCH = 3
    HARM = 2

    step: int
    value: float
    typical: float
    ratio: float
    after: list[bool] = field(default_factory=list)
    details: dict[str, float] = field(default_factory=dict)
    """What the detector measured at the jump, for the event that tells it again."""

    def harmful(self, up: bool) -> bool | None:
        """Record whether the next step's value is still up. True: the jump did harm; False: it
        came back; None: not known yet."""
        self.after.append(up)
        ups = sum(self.after)
        if self.after == [True] or ups >= self.HARM:
            return True
        if ups + self.WATCH - len(self.after) < self.HARM:
            return False
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "value": self.value, "typical": self.typical,
                "ratio": self.ratio, "after": list(self.after), "details": dict(self.details)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Outlier:
        return cls(int(state["step"]), float(state["value"]), float(state["typical"]),
                   float(state["ratio"]), [bool(v) for v in state.get("after", [])],
                   {str(k): float(v) for k, v in state.get("details", {}).items()})


class Detector:
    """Base class. Subclasses set `kind` and implement `check`; stateful ones extend the state
    methods so a resumed job keeps its baselines."""

    kind: str = ""
    reads: frozenset[str] = frozenset()
    """The `StepSignals` fields `check` reads, `step` aside (a property such as `loss_finite`
    counts as the field it derives from). The offline analyzer hands a detector the log's rows
    by what it reads and leaves it out of a log that holds none of it;
    `tests/detect/test_reads.py` checks the declaration against what `check` does."""
    reads_sampled_only: bool = False
    """True for detectors that only look at heavy-probe results (safe to run at close)."""
    live_only: bool = False
    """True for a detector that judges a whole run from its first step and cannot judge a log,
    which may be an excerpt that begins anywhere (a stall)."""
    judges_start: bool = False
    """True for a detector that judges the first steps of training: left out of a log that does
    not begin at the run's start."""
    raises_from: frozenset[str] | None = None
    """The `StepSignals` fields without which `check` raises nothing, whatever else it reads
    (None: any of `reads`). A log that holds none of them leaves the detector out."""
    idle_without: frozenset[str] = frozenset()
    """Optional `StepSignals` fields (`detect/on_duty.py`: `trainer_metrics`, `sampled`) on
    whose absence, all of them at once, `check` is a no-op: it raises nothing and moves no
    state, so the live pipeline leaves the detector out of such a step.
    `tests/detect/test_on_duty.py` checks the declaration against what `check` does."""
    budget_us: float = 5.0
    """What `check` may cost on the usual step of a small, host-bound run, in microseconds of the
    stepping thread: the MLP workload of `benchmarks/overhead.py` on one CPU thread, where a step
    takes about 2 ms and the Guard's host work is most of what it adds. `python
    benchmarks/stage_profile.py --workload mlp --clock thread --budgets` measures each detector
    against it. A detector that needs more on every step states it (and says why)."""

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config

    def check(self, signals: StepSignals) -> list[Event]:
        raise NotImplementedError

    def skip_calm(self, columns: SignalColumns, start: int, end: int) -> int:
        """Offline, over a log's rows (`detect/calm.py`): the first position in [start, end]
        whose row `check` must see, the rows before it being calm ones (rows on which `check`
        raises nothing), with this detector's state brought past them exactly as `check` would
        have left it. The default skips nothing."""
        del columns, end
        return start

    def calm_bounds(self) -> tuple[float, float] | None:
        """Live, for the calm lane (`pipeline/calm.py`): the highest loss and gradient norm a
        step may show to be taken there, until the next full step; within them `check` is sure
        to raise nothing. None: every step must be checked in full now (an episode open, an outlier
        waiting). The default bounds nothing: a detector whose check cannot raise on a step the
        lane takes (finite, the same gradients zero as at the last full step, no LR rise of
        1.5x, nothing sampled, no scaler, no trainer metrics)."""
        return (math.inf, math.inf)

    live_in_lane = False
    """Checked at each step the calm lane takes (`calm_at`, then `take_calm`), not in the block
    handed over: a detector whose state decides what the next steps do (the precursor's
    cadence) or that counts steps towards a verdict (a divergence's patience, the stall's
    judgement)."""

    def calm_at(self, signals: StepSignals) -> bool:
        """A live detector's: whether `check` is sure to raise nothing on this step, known
        without changing anything (the lane then runs `take_calm`)."""
        del signals
        return False

    def take_calm(self, signals: StepSignals) -> list[Event]:
        """`check` of a step `calm_at` called calm (nothing, as it said)."""
        return self.check(signals)

    def untrained(self) -> tuple[int, str] | None:
        """At the run's end: the length of a streak of this detector's, long enough to have
        been reported and lasting to the last step, over which nothing was learned (no
        gradient, no reward signal, a policy that never left its reference), and what it was,
        as "<what> from step N to the end" says it; None (the default): the last steps
        learned, as far as this detector can tell. The verdict calls such a run stalled."""
        return None

    def event(self, step: int, severity: Severity, message: str, *, param: str | None = None,
              value: float | None = None, **details: Any) -> Event:
        return Event(kind=self.kind, step=step, severity=severity, message=message, param=param,
                     value=value, details=details)

    def name_list(self, names: list[str]) -> str:
        shown = names[: self.config.common.max_named_params]
        more = len(names) - len(shown)
        return ", ".join(shown) + (f" and {more} more" if more > 0 else "")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


class FromStartLevel(Detector):
    """A detector that judges a trainer metric against the level the run started at: the
    median of its first `warmup` finite values (the entropy, the chosen log-probability), once
    per episode."""

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.first: list[float] = []
        """The first finite values: the level the run started at."""
        self.episode = Episode(config.common.rearm_steps)
        self.streak = 0
        """Logged steps in a row the state judged has held."""

    def start_level(self, value: float, warmup: int) -> float | None:
        """The starting level once `warmup` values are in (this one kept until then), else None."""
        if len(self.first) < warmup:
            self.first.append(value)
            return None
        return statistics.median(self.first)

    def held(self, holds: bool, needed: int = 1) -> bool:
        """Move the streak on by this step; whether the detector fires at it (the state held
        `needed` steps in a row, once per episode)."""
        self.streak = self.streak + 1 if holds else 0
        return self.episode.update(self.streak >= needed)

    def state_dict(self) -> dict[str, Any]:
        return {"first": list(self.first), "episode": self.episode.state_dict(),
                "streak": self.streak}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.first = [float(v) for v in state.get("first", [])]
        self.streak = int(state.get("streak", 0))
        if "episode" in state:
            self.episode.load_state_dict(state["episode"])


class StreakDetector(Detector):
    """A detector of a state that must hold `needed` steps in a row before it fires (once per
    episode)."""

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.streak = 0
        self.episode = Episode(config.common.rearm_steps)

    @property
    def needed(self) -> int:
        """Steps in a row the state must hold before the detector fires."""
        raise NotImplementedError

    def count(self, holds: bool) -> bool:
        """Move the streak on by this step; whether the detector fires at it."""
        self.streak = self.streak + 1 if holds else 0
        return self.episode.update(self.streak >= self.needed)

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak, "episode": self.episode.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak = int(state.get("streak", 0))
        if "episode" in state:
            self.episode.load_state_dict(state["episode"])


class UnlearnedStreak(StreakDetector):
    """A detector of a state in which nothing is learned (a dead reward signal, a policy that
    never leaves its reference): a streak that lasts to the run's end is what `untrained`
    reports, as `unlearned` says it."""

    unlearned: str = ""
    """What the state is, as the verdict's "<what> from step N to the end" says it."""

    def untrained(self) -> tuple[int, str] | None:
        return (self.streak, self.unlearned) if self.streak >= self.needed else None


class OutlierDetector(Detector):
    """A detector that tells a one-step jump as an outlier batch (`Outlier`) and tells it again,
    through `_stayed`, once the steps after it show it did harm."""

    outlier: Outlier | None = None

    def _judge_outlier(self, signals: StepSignals, *, up: bool) -> list[Event]:
        """The outlier told again where the values after it show it did harm (`up`: this step's
        value is still up)."""
        outlier = self.outlier
        if outlier is None:
            return []
        harmful = outlier.harmful(up)
        if harmful is not None:
            self.outlier = None
        return [self._stayed(outlier, signals)] if harmful else []

    def _stayed(self, outlier: Outlier, signals: StepSignals) -> Event:
        """The event that tells the outlier again, as harm."""
        raise NotImplementedError

