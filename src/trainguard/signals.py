"""Host-side view of one step, and the running baselines detectors compare it against."""

from __future__ import annotations

import bisect
import math
import statistics
import sys
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np

MAD_TO_STD = 1.4826  # scales a median absolute deviation to a normal standard deviation


@dataclass(slots=True)
class SampledStats:
    """Heavy-probe results measured at `step` (read on the host one step later)."""

    step: int
    per_param: dict[str, np.ndarray] = field(default_factory=dict)
    module_names: list[str] = field(default_factory=list)
    per_module: dict[str, np.ndarray] = field(default_factory=dict)
    output: dict[str, float] = field(default_factory=dict)
    """What the model predicted at `step` (`trainguard.probes.outputs`), when it was watched."""


@dataclass(slots=True)
class StepSignals:
    """Everything measured at one step, on the host. Values may be NaN or inf."""

    step: int
    loss: float | None
    grad_norm: float
    param_grad_norm: np.ndarray
    param_names: list[str]
    lr: float | None = None
    """The first parameter group's learning rate at this step."""
    group_lrs: tuple[float, ...] = ()
    """The learning rate of every parameter group at this step (NaN where a group has none)."""
    loss_scale: float | None = None
    amp_overflow: bool = False
    """The GradScaler found inf/NaN in the scaled gradients while the loss was finite."""
    fp16_grad_maxabs: float | None = None
    sampled: list[SampledStats] = field(default_factory=list)
    """Heavy-probe results that arrived with this step's transfer (usually from the step before)."""
    precursors: dict[str, np.ndarray] = field(default_factory=dict)
    """Every-step precursor values by metric key, one per watched parameter
    (`adam_ratio_rms`, `trainguard.probes.adam_ratio`); empty when not measured."""
    loss_curvature: float | None = None
    """The smoothed second difference of the log loss (`LossCurvature`); None early on."""
    lr_managed: bool = False
    """The recover policy sets the LR at this step (a backoff ramping back after a rollback)."""
    loss_requires_grad: bool | None = None
    """Whether the loss tensor handed over required grad (None: a number, or not known)."""
    ranks: Any = None
    """Under torch.distributed, what each rank contributed (`distributed.RankView`): which rank
    a non-finite loss or gradient or a spike came from, and the replicas' fingerprint drift."""
    attention_logits: dict[str, float] = field(default_factory=dict)
    """The largest pre-softmax attention logit of each attention layer, by module name
    (`attn_logit_max`, `trainguard.probes.attention_logits`), on the steps it was measured."""
    batch_elements: int | None = None
    """The elements of the step's batch (its largest tensor: samples times positions), from its
    shape alone; None when the step was handed no batch. A smaller batch has a noisier gradient."""
    clip_limit: float | None = None
    """The global clipping limit in force when the step was measured (the fixed one, or the
    adaptive clip's before this step's own events; None: no clipping): a gradient norm above it
    reaches the optimizer scaled down to it."""
    grads_absent: tuple[int, ...] | None = None
    """The watched parameters (indices into `param_names`) with no gradient tensor at this step
    (none computed: frozen by the loop, or outside the graph); a computed gradient of zeros is
    present, its zero norm a path to the parameter that was blocked. None: not known (a log)."""
    trainer_metrics: dict[str, float] = field(default_factory=dict)
    """The training metrics the trainer computed at this step, by its own names (a TRL
    trainer's `reward`, `kl`, `rewards/margins`...: `integrations/trl.py`), NaN and inf kept;
    empty when the trainer computed none at this step."""

    @property
    def loss_finite(self) -> bool:
        return self.loss is None or math.isfinite(self.loss)

    @property
    def grads_finite(self) -> bool:
        return math.isfinite(self.grad_norm)

    def nonfinite_params(self) -> list[str]:
        bad = np.flatnonzero(~np.isfinite(self.param_grad_norm))
        return [self.param_names[i] for i in bad]


class LossOrigin:
    """Where the loss started: the median of its first `count` finite values. A rise of the loss
    smaller than `resolution` times that is float noise at the run's scale, however large a
    ratio it makes near zero (a loss converged to 1e-14 that wobbles to 1e-13)."""

    def __init__(self, count: int, resolution: float) -> None:
        self.count = max(count, 1)
        self.resolution = resolution
        self.first: list[float] = []

    def observe(self, loss: float) -> None:
        if len(self.first) < self.count and math.isfinite(loss):
            self.first.append(float(loss))

    @property
    def full(self) -> bool:
        """Whether the first values are all in: `observe` changes nothing any more."""
        return len(self.first) >= self.count

    def negligible(self, rise: float) -> bool:
        """Whether a rise of the loss by `rise` (in loss units) is within float noise."""
        return bool(self.first) and rise < statistics.median(self.first) * self.resolution

    def state_dict(self) -> dict[str, Any]:
        return {"first": list(self.first)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.first = [float(v) for v in state.get("first", [])][:self.count]


class RobustBaseline:
    """Median and MAD of the last `window` admitted values, in log space.

    NaN-safe: non-finite values are never admitted. Callers admit anomalous values winsorised to
    their threshold, so one spike cannot poison the baseline but a lasting change of regime is
    learned slowly.
    """

    MAD_REFRESH = 8
    """The spread is recomputed every this many admitted values (it only guards against noise
    and moves slowly); the median is always exact."""

    def __init__(self, window: int, min_scale: float) -> None:
        self.window = window
        self.min_scale = min_scale
        self.values: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []
        self._scale: float | None = None
        self._since_scale = 0

    def __len__(self) -> int:
        return len(self.values)

    def admit(self, log_value: float) -> None:
        if not math.isfinite(log_value):
            return
        if len(self.values) == self.window:
            del self._sorted[bisect.bisect_left(self._sorted, self.values[0])]
        self.values.append(log_value)
        bisect.insort(self._sorted, log_value)
        self._since_scale += 1
        if self._since_scale >= self.MAD_REFRESH or len(self.values) <= self.MAD_REFRESH:
            self._scale = None

    def median(self) -> float:
        return sorted_median(self._sorted)

    def lowest_median(self, admits: int) -> float | None:
        """A value the median cannot go under within `admits` more admitted values: each moves
        a place of the sorted window by one at most (None: the window is too short to tell)."""
        place = (len(self._sorted) - 1) // 2 - admits
        return self._sorted[place] if place >= 0 else None

    def stats(self) -> tuple[float, float]:
        """(median, robust standard deviation) of the admitted log values."""
        median = self.median()
        if self._scale is None:
            # |v - median| read off the sorted values without a call per value: below the
            # median it is median - v, which rounds to exactly abs(v - median)
            ordered = self._sorted
            split = bisect.bisect_left(ordered, median)
            mad = _median([median - v for v in ordered[:split]]
                          + [v - median for v in ordered[split:]])
            self._scale = max(mad * MAD_TO_STD, self.min_scale)
            self._since_scale = 0
        return median, self._scale

    def recent_median(self, count: int) -> float:
        """Median of the `count` most recent admitted values."""
        return _median(list(islice(reversed(self.values), count)))

    def admit_all(self, log_values: np.ndarray, *, stats_first: bool) -> None:
        """The state `admit` leaves after each of `log_values` (all finite), with `stats` called
        at each one, before its `admit` (`stats_first`) or after it: what a detector that does
        so on every step holds after them, without a median per value. The spread is computed
        once, at the last refresh, from the window it saw then."""
        values = np.asarray(log_values, dtype=np.float64)
        filled = 0
        while filled < len(values) and len(self.values) < self.window:  # one by one until full
            if stats_first and self.values:
                self.stats()
            self.admit(float(values[filled]))
            if not stats_first:
                self.stats()
            filled += 1
        values = values[filled:]
        m = len(values)
        if not m:
            return
        period = self.MAD_REFRESH if self.window > self.MAD_REFRESH else 1
        since = self._since_scale
        if stats_first:  # stats at k sees the window before value k
            first = 0 if self._scale is None else max(period - since, 1)
        else:  # stats at k sees the window after value k
            first = 0 if self._scale is None else max(period - since - 1, 0)
        seen = np.concatenate([np.fromiter(self.values, dtype=np.float64, count=len(self.values)),
                               values])
        if first < m:
            last = first + (m - 1 - first) // period * period
            end = len(self.values) + last + (0 if stats_first else 1)
            window = seen[end - self.window:end]
            median = _median(window.tolist())
            mad = _median(np.abs(window - median).tolist())
            self._scale = max(mad * MAD_TO_STD, self.min_scale)
            self._since_scale = m - last if stats_first else m - 1 - last
        else:
            self._since_scale = since + m
        if stats_first and (self._since_scale >= self.MAD_REFRESH
                            or self.window <= self.MAD_REFRESH):
            self._scale = None  # the last admit asked for a refresh the next stats makes
        self.values = deque(seen[-self.window:].tolist(), maxlen=self.window)
        self._sorted = sorted(self.values)

    def state_dict(self) -> dict:
        return {"values": list(self.values), "scale": self._scale,
                "since_scale": self._since_scale}

    def load_state_dict(self, state: dict) -> None:
        self.values = deque(state["values"], maxlen=self.window)
        self._sorted = sorted(self.values)
        self._scale = state.get("scale")
        self._since_scale = int(state.get("since_scale", 0))


class LossCurvature:
    """The smoothed second difference of the log loss, per step (the guide's "second derivative
    of the loss"): the loss is smoothed by an exponential moving average of span `span`, and the
    curvature is its second difference. Positive while the loss accelerates upwards (or its fall
    slows), negative while it accelerates downwards. NaN-safe: non-finite losses are skipped."""

    def __init__(self, span: int = 10) -> None:
        self.decay = 1.0 - 2.0 / (span + 1)
        self.levels: list[float] = []
        self.raw = 0.0
        self.seen = 0

    def observe(self, loss: float | None) -> float | None:
        """The curvature at this step, None until three finite losses were seen."""
        if loss is None or not math.isfinite(loss) or loss <= 0:
            return None
        self.raw = self.decay * self.raw + (1 - self.decay) * math.log(loss)
        self.seen += 1
        self.levels = [*self.levels[-2:], self.raw / (1 - self.decay ** self.seen)]
        if len(self.levels) < 3:
            return None
        a, b, c = self.levels
        return c - 2 * b + a

    def observe_all(self, losses: list[float | None]) -> list[float | None]:
        """`observe` of each loss in turn (a whole log's, offline), with what it returns."""
        decay, raw, seen = self.decay, self.raw, self.seen
        gain = 1 - decay
        exact = settled_at(decay)
        known = len(self.levels)  # the last three levels, in three names
        a, b, c = [0.0] * (3 - known) + self.levels
        out: list[float | None] = []
        append, log, isfinite = out.append, math.log, math.isfinite
        for loss in losses:
            if loss is None or not isfinite(loss) or loss <= 0:
                append(None)
                continue
            raw = decay * raw + gain * log(loss)
            seen += 1
            a, b, c = b, c, raw if seen >= exact else raw / (1 - decay ** seen)
            known = min(known + 1, 3)
            append(c - 2 * b + a if known == 3 else None)
        levels = [a, b, c][3 - known:]
        self.raw, self.seen, self.levels = raw, seen, levels
        return out

    def state_dict(self) -> dict:
        return {"levels": list(self.levels), "raw": self.raw, "seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.levels = [float(v) for v in state["levels"]]
        self.raw = float(state["raw"])
        self.seen = int(state["seen"])


class TransientJumps:
    """How far this run's own one-step jumps have gone, to judge the next one against.

    A jump (log value minus its level) that is back to normal at the very next step was
    *transient*: data with heavy tails (Student-t targets, tiny batches) makes such jumps as a
    matter of course, and a run that has shown them is not alarming when it shows another of the
    same size. The largest transient jump of the last `horizon` steps is kept; a new jump counts
    as anomalous only when it is `margin` (in log space) beyond that. Jumps that persist (the
    loss stays up: a real fault) never enter. NaN-safe: only finite jumps are recorded.
    """

    def __init__(self, horizon: int, margin: float) -> None:
        self.horizon = horizon
        self.margin = margin
        self.jumps: deque[tuple[int, float]] = deque()
        self._open: tuple[int, float] | None = None
        """The jump of the step before, waiting to be judged transient or not."""
        self._was_normal = True

    def threshold(self, step: int) -> float:
        """The excess a jump at `step` must reach to stand out from this run's history (-inf
        when the run has shown no transient jump lately)."""
        while self.jumps and self.jumps[0][0] < step - self.horizon:
            self.jumps.popleft()
        if not self.jumps:
            return -math.inf
        return max(excess for _, excess in self.jumps) + self.margin

    def observe(self, step: int, excess: float, *, jumped: bool, normal: bool) -> None:
        """`jumped`: this step's excess counts as a jump; `normal`: it is back at its level.
        Only a jump between two normal steps is transient (the last step of a sustained
        episode is not)."""
        if self._open is not None and normal:
            self.jumps.append(self._open)
        isolated = jumped and self._was_normal and math.isfinite(excess)
        self._open = (step, excess) if isolated else None
        self._was_normal = normal

    @property
    def open_jump(self) -> bool:
        """Whether the step before jumped, and waits to be judged transient or not."""
        return self._open is not None

    def back_to_normal(self) -> None:
        """`observe` of a step back at its level that did not jump, with no jump open."""
        self._was_normal = True

    def state_dict(self) -> dict:
        return {"jumps": [list(j) for j in self.jumps],
                "open": list(self._open) if self._open is not None else None,
                "was_normal": self._was_normal}

    def load_state_dict(self, state: dict) -> None:
        self.jumps = deque((int(s), float(e)) for s, e in state.get("jumps", []))
        open_ = state.get("open")
        self._open = (int(open_[0]), float(open_[1])) if open_ is not None else None
        self._was_normal = bool(state.get("was_normal", True))


def settled_at(decay: float) -> int:
    """The count from which the bias correction `1 - decay ** n` of a moving average is exactly
    1.0 (it only grows with n): dividing by it changes nothing from there on."""
    if not -1.0 < decay < 1.0:
        return sys.maxsize  # a weight that does not decay: never
    n = 1
    while 1.0 - decay ** n != 1.0:
        n += 1
    return n


def _median(values: list[float]) -> float:
    return sorted_median(sorted(values))


def sorted_median(ordered: list[float]) -> float:
    """The median of values already sorted (`statistics.median`'s, without sorting again)."""
    n = len(ordered)
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


def safe_log(value: float) -> float:
    """log of a positive finite value; -inf for 0, NaN for anything else."""
    if not math.isfinite(value) or value < 0:
        return math.nan
    return math.log(value) if value > 0 else -math.inf
