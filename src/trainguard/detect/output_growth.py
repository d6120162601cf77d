"""The output-side precursors of `instability_precursor`: log Z and Adam's update RMS growing.

`instability_precursor` composes one `OutputGrowth`; its events are that kind's (a warning, the
same fields: param, value, signal, baseline, ratio, steps_above, trend and the value `before`
it, expected_lead), so the LR brake, the ranking and the sinks treat them alike.

Signals (measured every step, riding the step's one transfer):
    logz_max         `probes/logz.py`: the largest log Z = logsumexp(logits) over the step's
                     positions. It warns when it stands `detectors.instability_precursor.logz_rise`
                     nats (Z that many times e) above its own median of the last `baseline_window`
                     steps and `detectors.instability_precursor.zscore` robust deviations above it,
                     on `detectors.instability_precursor.steps` of the last `LOGZ_WITHIN` steps.
                     Cross-entropy only pins the logits' differences: a log Z that keeps climbing is
                     output logits that grow without bound (an output head's LR past what it can
                     take, no z-loss), and the loss spikes once the updates, multiplied by those
                     logits, overshoot. The largest position leads the mean: on the `logit_growth`
                     scenarios the mean rose about 2 nats in the 50 steps before the spike (as a
                     healthy run's does while it learns), the largest position's jumped 3-6 nats
                     above its median 10-20 steps before it. Only while the mean log Z is up too
                     (`MEAN_RISE`), and not while the loss is still coming down
                     (`LEARNING`): a model that learns raises log Z as it should.
    adam_update_rms  `probes/adam_ratio.py`: per parameter, RMS(m_hat) / RMS(sqrt(v_hat)), the
                     previous update over the LR. Noise keeps it low; gradients that keep one
                     direction step after step lift it towards 1. It warns when a parameter's
                     value is `detectors.instability_precursor.ratio` times its median,
                     `detectors.instability_precursor.zscore` robust deviations of its log above it
                     and at least `detectors.instability_precursor.update_min`, for
                     `detectors.instability_precursor.steps` steps in a row.

Each stays silent while its baseline is young (`detectors.instability_precursor.warmup` steps: a
model from scratch raises log Z while it learns), reports an episode once (log Z again each time it
climbs a further `detectors.instability_precursor.logz_rise` nats within the episode: logits still
growing after the warning, which the LR brake answers with a lasting ceiling), and lets values above
its bound enter the baseline capped at the bound (one burst does not lift the level it is compared
with).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from trainguard.detect.aftermath import AHEAD
from trainguard.detect.base import Episode
from trainguard.detect.columns import column_medians
from trainguard.detect.settings import DetectorConfig
from trainguard.detect.trend import since, trend
from trainguard.events import Event
from trainguard.signals import MAD_TO_STD, StepSignals

LOGZ = "logz_max"
LOGZ_MEAN = "logz_mean"
UPDATE = "adam_update_rms"
LOGZ_LEAD = "~15"
"""The lead the log Z message announces (`benchmarks/precursors.py`, family `logit_growth`)."""
UPDATE_LEAD = "~10"
RECENT = 5
"""Steps over which the trend is read."""
LOGZ_WITHIN = 4
"""log Z warns once it was high on `detectors.instability_precursor.steps` of the last this many
steps: the largest position's log Z jumps from batch to batch, a growing one above its bound more
and more often."""

LOGZ_FIXES = ("lower the LR (the output head's group first)",
              "a z-loss, 1e-4 x log Z^2 added to the loss (PaLM)",
              "soft-cap the logits, cap * tanh(logits / cap) (Gemma 2)",
              "weight decay on the output head, or label smoothing (bounded logits)")
"""What holds the output logits; named in the log Z event (`fixes`)."""

MEAN_RISE = 0.75
"""log Z warns only while the mean log Z over positions is this many nats above its own median
too: one position's log Z jumps from batch to batch on a small batch of a classifier (a healthy BERT
fine-tune's largest rose 4 nats above its median while the mean stayed at its level); logits
that grow everywhere move the mean too."""
LEARNING = 0.9
"""log Z does not warn while the loss's median over the last `LEARNING_STEPS` steps is below
this share of its median over the baseline window: a model that is still learning sharpens its
logits and raises log Z as it should; logits that grow while the loss stays put (as on the
`logit_growth` fault, its loss at its level while log Z climbed) are what comes before the
spike."""
LEARNING_STEPS = 10

NEAR = 0.5
"""A value that covered this share of the way to its bound (from the lowest value kept for log Z,
from 0 for a ratio's floor) keeps the probes measuring every step: a value rising towards its
bound is measured at each step of its streak, so the cadence does not delay a warning."""

MakeEvent = Callable[..., Event]
"""`Detector.event` of the composing detector: the events are of its kind."""


class Streaks:
    """Columns of one signal, each against its own recent median (in the space the rule is
    judged in: log Z in nats, the update RMS as its log)."""

    def __init__(self, window: int, warmup: int, rearm: int, within: int) -> None:
        self.warmup = warmup
        self.hits: deque[np.ndarray] = deque(maxlen=within)
        """Which columns were high at each of the last `within` steps."""
        self.streak = np.zeros(0, dtype=np.int64)
        """How many of the last `within` steps each column was high."""
        self.first = np.zeros(0)
        """Each column's value `RECENT` steps before its streak began (for the trend)."""
        self.recent: deque[np.ndarray] = deque(maxlen=RECENT)
        """The last values as measured (the history holds them capped)."""
        self.episode = Episode(rearm)
        self._ring = np.full((window, 0), np.nan)
        """The last `window` rows kept (capped where they were high), in a ring: medians and the
        lowest value do not need their order (`history` gives it)."""
        self._count = 0
        self._next = 0

    @property
    def history(self) -> list[np.ndarray]:
        """The rows kept, oldest first."""
        if self._count < len(self._ring):
            return list(self._ring[:self._count])
        return list(np.roll(self._ring, -self._next, axis=0))

    def _lowest(self) -> np.ndarray:
        """Each column's lowest value kept (NaN for a column of nothing but NaN)."""
        return np.fmin.reduce(self._ring[:self._count], axis=0)

    def hold(self, steps: int) -> None:
        """The last row measured stands for `steps` steps the probe did not measure (its
        cadence skips only quiet steps): the baseline, the recent values and the hits move as if
        it had been measured on each."""
        if not self.recent:
            return
        row, last = self._ring[(self._next - 1) % len(self._ring)], self.recent[-1]
        quiet = np.zeros(last.shape, dtype=bool)
        for _ in range(min(steps, len(self._ring))):
            self.recent.append(last)
            self.hits.append(quiet)
            self._remember(row)
        self.streak = np.zeros(last.shape, dtype=np.int64)

    def quiet_rows(self, measured: list[tuple[int, np.ndarray]]) -> None:
        """`hold` and `update` of rows the caller knows take the quiet path (a grown baseline,
        no streak, every value finite and under its lowest value kept plus the margin), in one
        go: each (steps the probe skipped before it, its values), in order."""
        if not measured:
            return
        size = len(self._ring)
        ring_rows: list[np.ndarray] = []
        recent_rows: list[np.ndarray] = []
        held_ring, held_recent = self._ring[(self._next - 1) % size], self.recent[-1]
        for held, values in measured:  # as `hold`, then `update`'s quiet path
            copies = min(held, size)
            ring_rows += [held_ring] * copies + [values]
            recent_rows += [held_recent] * copies + [values]
            held_ring = held_recent = values
        count = len(ring_rows)
        kept = ring_rows[-size:]  # the rows the ring still holds after all of them
        where = (self._next + count - len(kept) + np.arange(len(kept))) % size
        self._ring[where] = np.stack(kept)
        self._next = (self._next + count) % size
        self._count = min(self._count + count, size)
        self.recent.extend(recent_rows[-RECENT:])
        quiet = np.zeros(measured[-1][1].shape, dtype=bool)
        self.hits.extend([quiet] * min(count, self.hits.maxlen or count))
        self.streak = np.zeros(quiet.shape, dtype=np.int64)

    def floor(self) -> float | None:
        """The lowest value kept of a single column whose baseline has grown, with no episode or
        streak open: what a plan of its quiet rows starts from (None otherwise)."""
        if (self._count < self.warmup or self.episode.active or self.streak.shape != (1,)
                or self.streak.any() or not self.recent):
            return None
        lowest = float(self._lowest()[0])
        return lowest if math.isfinite(lowest) else None

    def calm_at(self, value: float, margin: float) -> bool:
        """Whether one more row of `value` (a single column) is sure to raise nothing: no
        episode or streak open, and the baseline young or the value under `margin` above the
        lowest value kept (`update`'s quiet step: nothing is high there)."""
        if not math.isfinite(value) or self.episode.active or self.streak.any():
            return False
        if self._count < self.warmup:
            return True
        return bool((value < self._lowest() + margin).all())

    def near(self, margin: float) -> bool:
        """Whether the last row is within `NEAR` of being high (`margin` above the lowest value
        kept), a streak is running or an episode is open: the probe then measures every step."""
        if self.episode.active or self.streak.any():
            return True
        if not self.recent or not self._count:
            return False
        with np.errstate(invalid="ignore"):
            return bool((self.recent[-1] >= self._lowest() + NEAR * margin).any())

    def _forget(self) -> None:
        self._ring = np.full((len(self._ring), 0), np.nan)
        self._count = self._next = 0

    def _remember(self, row: np.ndarray) -> None:
        if self._ring.shape[1] != row.shape[0]:  # the first row after `_forget`
            self._ring = np.full((len(self._ring), row.shape[0]), np.nan)
        self._ring[self._next] = row
        self._next = (self._next + 1) % len(self._ring)
        self._count = min(self._count + 1, len(self._ring))

    def update(self, values: np.ndarray, margin: float, zscore: float, floor: float,
               allowed: np.ndarray | Callable[[], np.ndarray] | None = None,
               ) -> tuple[np.ndarray, np.ndarray] | None:
        """This step's values; (high, median) per column, None while the baseline is young
        (the streaks move; the caller decides on an episode). A column is high when it is
        `margin` and `zscore` robust deviations (at least `floor`) above its median (and, with
        `allowed`, or what it returns, where that is True). On a step where nothing can be high
        the medians are not computed (NaN)."""
        values = np.where(np.isfinite(values), values, np.nan)
        if self.streak.shape != values.shape:  # the columns changed: start again
            self._forget()
            self.streak = np.zeros(values.shape, dtype=np.int64)
            self.first = np.zeros(values.shape)
            self.recent.clear()
            self.hits.clear()
        oldest = self.recent[0] if self.recent else values  # `RECENT` steps back at most
        self.recent.append(values)
        if self._count < self.warmup:
            self._remember(values)
            return None
        with np.errstate(invalid="ignore"):
            # the median is at least the lowest value kept, and a high value is `margin` above
            # the median: below lowest + margin nothing is high (NaN is never high), so the state
            # moves as below without the medians (most of the cost on a small model's step)
            quiet = not (values >= self._lowest() + margin).any()
        if quiet:
            high = np.zeros(values.shape, dtype=bool)
            self.hits.append(high)
            self.streak = np.zeros(values.shape, dtype=np.int64)
            self._remember(values)
            return high, np.full(values.shape, np.nan)
        if callable(allowed):
            allowed = allowed()
        stacked = self._ring[:self._count]
        seen = np.isfinite(stacked).sum(axis=0) >= self.warmup // 2
        known = np.where(seen, stacked, np.nan)
        level = column_medians(known)
        spread = MAD_TO_STD * column_medians(np.abs(known - level))
        bound = level + np.maximum(margin, zscore * np.maximum(spread, floor))
        high = seen & np.isfinite(values) & (values >= bound)
        if allowed is not None:
            high &= allowed
        self.first = np.where(high & (self.streak == 0), oldest, self.first)
        self.hits.append(high)
        self.streak = np.where(high, np.sum(self.hits, axis=0), 0)
        # a value kept from warning (`allowed`) enters uncapped: healthy growth moves the level
        self._remember(np.where(high, bound, values))
        return high, level

    def state_dict(self) -> dict[str, Any]:
        return {"history": [[None if not math.isfinite(v) else float(v) for v in row]
                            for row in self.history],
                "streak": [int(v) for v in self.streak], "first": [float(v) for v in self.first],
                "hits": [[bool(v) for v in row] for row in self.hits],
                "episode": self.episode.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._forget()
        for row in state.get("history", []):
            self._remember(np.array([math.nan if v is None else float(v) for v in row]))
        self.streak = np.array(state.get("streak", []), dtype=np.int64)
        self.first = np.array(state.get("first", [0.0] * len(self.streak)), dtype=np.float64)
        self.hits.clear()
        for hit in state.get("hits", []):
            self.hits.append(np.array(hit, dtype=bool))
        if "episode" in state:
            self.episode.load_state_dict(state["episode"])


class OutputGrowth:
    """The log Z and update RMS precursors; `check` returns this step's events (at most one
    per signal)."""

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        window, warmup, rearm = (config.common.baseline_window,
                                 config.instability_precursor.warmup, config.common.rearm_steps)
        self.logz = Streaks(window, warmup, rearm, LOGZ_WITHIN)
        self.losses: deque[float] = deque(maxlen=window)
        self.means: deque[float] = deque(maxlen=window)
        """The mean log Z of the last `baseline_window` steps."""
        self.updates = Streaks(window, warmup, rearm, config.instability_precursor.steps)
        self.logz_reported: tuple[int, float] | None = None
        """(step, value) of the last log Z report of the open episode (None: no episode)."""

    def calm_row(self, loss: float | None) -> None:
        """`check` of a step the probes skipped, which holds no value of theirs: its loss is
        kept (`learning`)."""
        if loss is not None and math.isfinite(loss):
            self.losses.append(loss)

    def logz_floor(self) -> float | None:
        """The lowest log Z kept, while its baseline has grown and no episode or streak is
        open and no update RMS is measured (`Streaks.floor`); None otherwise."""
        if self.updates.recent:
            return None
        return self.logz.floor()

    def quiet_logz(self, measured: list[tuple[int, np.ndarray, float]]) -> None:
        """`check` of steps where log Z alone was measured, each (the steps the probes skipped
        before it, its largest log Z, its mean log Z), known to take the quiet path (the calm
        lane's plan, `SkippedSteps.logz_row`), in one go after their losses were kept: the
        values before each standing for the steps between, each largest log Z into the baseline,
        each mean into the means."""
        if not measured:
            return
        self.logz.quiet_rows([(held, value) for held, value, _ in measured])
        means = self.means
        for held, _, mean in measured:
            if held and means:
                means.extend([means[-1]] * min(held, means.maxlen or held))
            if math.isfinite(mean):
                means.append(mean)
        self.logz_reported = None  # as `_logz_further` leaves it outside an episode

    def check(self, signals: StepSignals, make: MakeEvent, held: int = 0) -> list[Event]:
        """`held`: steps since the last measurement that the probes skipped (their values held)."""
        events: list[Event] = []
        if signals.loss is not None and math.isfinite(signals.loss):
            self.losses.append(signals.loss)
        if held:
            self._hold(signals, held)
        mean = signals.precursors.get(LOGZ_MEAN)
        value = (math.nan if mean is None
                 else float(np.asarray(mean, dtype=np.float64).reshape(-1)[0]))

        def allowed() -> np.ndarray:
            """Whether log Z may warn: the mean up too (against the means before this step's),
            the loss no longer coming down; asked only on a step where log Z may be high."""
            mean_high = (math.isfinite(value)
                         and len(self.means) >= self.config.instability_precursor.warmup
                         and value >= float(np.median(self.means)) + MEAN_RISE)
            return np.array([mean_high and not self.learning()])

        logz = signals.precursors.get(LOGZ)
        if logz is not None:
            event = self._logz(signals, np.asarray(logz, dtype=np.float64).reshape(-1)[:1],
                               allowed, make)
            if event is not None:
                events.append(event)
        if math.isfinite(value):
            self.means.append(value)
        updates = signals.precursors.get(UPDATE)
        if updates is not None:
            event = self._updates(signals, np.asarray(updates, dtype=np.float64), make)
            if event is not None:
                events.append(event)
        return events

    def _logz(self, signals: StepSignals, values: np.ndarray,
              allowed: Callable[[], np.ndarray], make: MakeEvent) -> Event | None:
        cfg, tracker = self.config, self.logz
        judged = tracker.update(values, cfg.instability_precursor.logz_rise,
                                cfg.instability_precursor.zscore,
                                cfg.common.min_log_scale, allowed=allowed)
        fired = self._fired(tracker, judged)
        value = float(values[0])
        if fired is None:
            return self._logz_further(signals, value, judged, make)
        _, level = fired
        typical = float(level[0])
        steps, first = int(tracker.streak[0]), float(tracker.first[0])
        rise = trend(value, first, tolerance=0.05, additive=True)
        ratio = math.exp(min(value - typical, 700.0))
        self.logz_reported = (signals.step, value)
        return make(
            signals.step, "warning",
            f"log Z of the output logits (largest logsumexp over positions) at {value:.3g}, "
            f"{value - typical:.3g} above its median {typical:.3g} "
            f"(Z {_z_times(value - typical)}), above it on {steps} of the last {LOGZ_WITHIN} "
            f"steps, {since(rise, first)}: the output logits keep growing{AHEAD}"
            f"{LOGZ_LEAD} steps (a z-loss or a lower LR holds them)",
            param="logits", value=value, signal=LOGZ, baseline=typical, ratio=ratio,
            bound=typical + self.config.instability_precursor.logz_rise,
            steps_above=steps, trend=rise, before=first, expected_lead=LOGZ_LEAD,
            fixes=list(LOGZ_FIXES))

    def _logz_further(self, signals: StepSignals, value: float, judged: Any,
                      make: MakeEvent) -> Event | None:
        """Within an open episode, log Z `detectors.instability_precursor.logz_rise` nats above the
        value it was last reported at, while still high: the logits kept growing after the warning
        (the LR that drives them was not lowered enough), which is reported again. An episode whose
        log Z holds or falls is reported once."""
        tracker, rise = self.logz, self.config.instability_precursor.logz_rise
        if not tracker.episode.active or judged is None:
            self.logz_reported = None
            return None
        reported = self.logz_reported
        if (reported is None or tracker.streak[0] < self.config.instability_precursor.steps
                or not value >= reported[1] + rise):
            return None
        self.logz_reported = (signals.step, value)
        typical = float(judged[1][0])
        return make(
            signals.step, "warning",
            f"log Z of the output logits at {value:.3g}, a further {value - reported[1]:.3g} "
            f"above the {reported[1]:.3g} it was reported at (step {reported[0]}): the output "
            f"logits are still growing{AHEAD}{LOGZ_LEAD} steps "
            "(a lower LR or a z-loss holds them)",
            param="logits", value=value, signal=LOGZ, baseline=typical,
            bound=typical + self.config.instability_precursor.logz_rise,
            ratio=math.exp(min(value - typical, 700.0)), steps_above=int(tracker.streak[0]),
            trend="rising", expected_lead=LOGZ_LEAD, fixes=list(LOGZ_FIXES),
            since_step=reported[0], since_value=reported[1])

    def _hold(self, signals: StepSignals, steps: int) -> None:
        """The values last measured stand for the `steps` steps before this one."""
        if LOGZ in signals.precursors:
            self.logz.hold(steps)
            if self.means:
                self.means.extend([self.means[-1]] * min(steps, self.means.maxlen or steps))
        if UPDATE in signals.precursors:
            self.updates.hold(steps)

    def calm_at(self, signals: StepSignals, held: int = 0) -> bool:
        """Whether `check` is sure to raise nothing on a step the probes measured (the calm
        lane's question), `held` steps after the last they measured: no update RMS, and log Z
        far from its bound (`Streaks.calm_at`) or, nearer, kept from warning at this step
        (`allowed`: the mean log Z not up, or the loss still coming down, as on a classifier
        that learns, whose log Z climbs with its confidence)."""
        if UPDATE in signals.precursors:
            return False
        logz = signals.precursors.get(LOGZ)
        if logz is None:
            return True
        value = float(np.asarray(logz, dtype=np.float64).reshape(-1)[0])
        tracker = self.logz
        if tracker.calm_at(value, self.config.instability_precursor.logz_rise):
            return True
        return (math.isfinite(value) and not tracker.episode.active and not tracker.streak.any()
                and not self._allowed_at(signals, held))

    def _allowed_at(self, signals: StepSignals, held: int) -> bool:
        """What `check`'s `allowed` will say on this step, from the state before it: the means
        as `_hold` extends them, the losses with this step's."""
        mean = signals.precursors.get(LOGZ_MEAN)
        value = (math.nan if mean is None
                 else float(np.asarray(mean, dtype=np.float64).reshape(-1)[0]))
        size = self.means.maxlen or len(self.means)
        means = list(self.means)
        if held and means:
            means = (means + [means[-1]] * min(held, size))[-size:]
        if not (math.isfinite(value) and len(means) >= self.config.instability_precursor.warmup
                and value >= float(np.median(means)) + MEAN_RISE):
            return False
        losses = list(self.losses)
        if signals.loss is not None and math.isfinite(signals.loss):
            losses = [*losses, signals.loss][-(self.losses.maxlen or len(losses) + 1):]
        return not _learning(losses)

    def near(self) -> bool:
        """Whether log Z or the update RMS is near its bound (`Streaks.near`)."""
        cfg = self.config.instability_precursor
        return (self.logz.near(cfg.logz_rise)
                or self.updates.near(math.log(cfg.ratio)))

    def _fired(self, tracker: Streaks, judged: Any) -> tuple[np.ndarray, np.ndarray] | None:
        """(which columns fire, their levels) when this step opens an episode of `tracker`,
        else None; the episode moves either way."""
        if judged is None:
            tracker.episode.update(False)
            return None
        firing = tracker.streak >= self.config.instability_precursor.steps
        if not tracker.episode.update(bool(firing.any())):
            return None
        return firing, judged[1]

    def learning(self) -> bool:
        """Whether the loss is still coming down (see `LEARNING`), by the losses up to the last
        step `check` was handed."""
        return _learning(list(self.losses))

    def _updates(self, signals: StepSignals, values: np.ndarray,
                 make: MakeEvent) -> Event | None:
        cfg, tracker = self.config, self.updates
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.where(np.isfinite(values) & (values > 0), np.log(values), np.nan)
        judged = tracker.update(logs, math.log(cfg.instability_precursor.ratio),
                                cfg.instability_precursor.zscore, cfg.common.min_log_scale,
                                allowed=values >= cfg.instability_precursor.update_min)
        fired = self._fired(tracker, judged)
        if fired is None:
            return None
        firing, level = fired
        index = int(np.argmax(np.where(firing, logs - level, -np.inf)))
        value, typical = float(values[index]), math.exp(float(level[index]))
        steps, first = int(tracker.streak[index]), math.exp(float(tracker.first[index]))
        rise = trend(value, first)
        name = (signals.param_names[index] if index < len(signals.param_names)
                else str(index))
        ratio = value / typical if typical > 0 else math.inf
        return make(
            signals.step, "warning",
            f"Adam update RMS of {name} at {value:.3g} of the LR, {ratio:.3g}x its median "
            f"{typical:.3g}, above it for {steps} steps, {since(rise, first)}: the gradient "
            f"keeps one direction step after step{AHEAD}{UPDATE_LEAD} steps",
            param=name, value=value, signal=UPDATE, baseline=typical, ratio=ratio,
            steps_above=steps, trend=rise, before=first, expected_lead=UPDATE_LEAD)

    def state_dict(self) -> dict[str, Any]:
        return {"logz": self.logz.state_dict(), "updates": self.updates.state_dict(),
                "losses": list(self.losses), "means": list(self.means),
                "logz_reported": (None if self.logz_reported is None
                                  else list(self.logz_reported))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "logz" in state:
            self.logz.load_state_dict(state["logz"])
        if "updates" in state:
            self.updates.load_state_dict(state["updates"])
        self.losses.clear()
        self.losses.extend(float(v) for v in state.get("losses", []))
        self.means.clear()
        self.means.extend(float(v) for v in state.get("means", []))
        reported = state.get("logz_reported")
        self.logz_reported = (None if reported is None
                              else (int(reported[0]), float(reported[1])))


def _learning(losses: list[float]) -> bool:
    """`OutputGrowth.learning` of these losses (oldest first)."""
    if len(losses) < 2 * LEARNING_STEPS:
        return False
    recent = float(np.median(losses[-LEARNING_STEPS:]))
    return recent < LEARNING * float(np.median(losses))


def _z_times(rise: float) -> str:
    """How many times Z grew for a rise of log Z (past what a float shows: as a power of e)."""
    return f"{math.exp(rise):.3g}x" if rise < 100 else f"e^{rise:.0f}x"
