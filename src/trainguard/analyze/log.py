"""What a reader makes of a training log: the logged series, row by row, in the log's own steps.

Every reader (one module per format) turns its file into a `Log`: one *row* per logged training
step, in the order the log has them, with the values of that step in named *series* (NaN where a
row does not hold a series), the evaluations apart, and notes on anything the reader had to
interpret. Series names are canonical where trainguard reads them: `loss` (the training loss the
log reports), `grad_norm` (the global gradient norm before clipping), `lr` (the learning rate, of
the first parameter group), `loss_scale` (an fp16 loss scale); every other numeric value keeps its
own name (`loss_total`, `mean_token_accuracy`...).

A row that does not hold a series has None there; a logged NaN or inf stays NaN or inf.

The series are kept sparse (`Series`): each as the rows that hold it and their values, laid out
over every row only when read. A log of 100k names each on a few rows (per-parameter gradient
norms) then costs memory in proportion to its values, not to its rows times its names.

A file that cannot be read (missing, truncated, of another format, holding no training values)
raises `LogError` with one message that names the file and the problem.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from trainguard.analyze import windows
from trainguard.errors import TrainguardError
from trainguard.events import Event

LOSS, GRAD_NORM, LR, LOSS_SCALE = "loss", "grad_norm", "lr", "loss_scale"
CANONICAL = (LOSS, GRAD_NORM, LR, LOSS_SCALE)

_ALIASES: dict[str, str] = {}
for _canonical, _names in (
    (LOSS, ("loss", "train_loss", "train/loss", "lm loss", "lm_loss", "train_loss_step",
            "loss_step", "training_loss", "train loss", "trainer/loss", "train/lm_loss",
            "train/train_loss_step", "training/loss")),
    (GRAD_NORM, ("grad_norm", "grad norm", "gnorm", "grad-norm", "gradient_norm", "grad_norm_total",
                 "train/grad_norm", "grad_norm/total", "trainer/grad_norm", "train/gnorm",
                 "global_grad_norm", "grad_norm_before_clip")),
    (LR, ("lr", "learning_rate", "learning rate", "train/learning_rate", "train/lr",
          "trainer/learning_rate", "lr-adam", "lr-adamw", "lr-sgd", "lr-adafactor", "lr-lamb",
          "lr-lion", "lr-rmsprop")),
    (LOSS_SCALE, ("loss_scale", "loss scale", "scaler/scale", "train/loss_scale", "loss-scale")),
):
    for _name in _names:
        _ALIASES[_name] = _canonical
del _canonical, _names

EVAL_PREFIXES = ("eval_", "eval/", "eval ", "val_", "val/", "val ", "valid_", "valid/", "valid ",
                 "validation_", "validation/", "validation ", "test_", "test/", "test ")
"""A value whose name starts like this is an evaluation metric, not a training row's."""

BOOKKEEPING = frozenset({
    "step", "global_step", "epoch", "iteration", "iter", "_step", "_runtime", "_timestamp",
    "total_flos", "train_runtime", "train_samples_per_second", "train_steps_per_second",
    "num_input_tokens_seen", "num_tokens", "time", "timestamp", "wall_time", "current_steps",
    "total_steps", "elapsed_time", "remaining_time", "percentage", "consumed samples",
    "trainer/global_step", "consumed tokens", "elapsed time per iteration (ms)",
    "elapsed time per iteration (s)",
    "samples per second", "tflops", "global batch size", "num zeros", "ms/batch", "it/sec",
    "tokens/sec", "trained tokens", "peak mem", "mfu", "epoch_time", "eta", "data_time",
    "max_mem", "memory", "batch_cost", "data_cost", "ips",
    # Megatron-LM's golden values and Megatron-Bridge's: clocks and memory counters
    "num-zeros", "iteration-time", "mem-allocated-bytes", "mem-max-allocated-bytes",
    "gpu utilization",
})
"""Counters, clocks and run-level totals: not training signals."""


MAX_STEP = 2 ** 63
"""Steps are 64-bit integers wherever they are kept (arrays, stores, plots)."""


class LogError(TrainguardError):
    """A training log cannot be read: the message names the file and the problem."""


def canonical_name(name: str) -> str:
    """The canonical series name of a logged value (`learning_rate` -> `lr`), else its own name
    (stripped, with `train/` dropped)."""
    key = name.strip()
    lowered = key.lower()
    if lowered in _ALIASES:
        return _ALIASES[lowered]
    if lowered.startswith("lr-") or lowered.startswith("lr/"):  # Lightning's LearningRateMonitor
        return LR if lowered.count("/") == 0 else key
    if lowered.startswith("train/"):
        return canonical_name(key[len("train/"):])
    if lowered.endswith(("/train", "_train")):  # TensorBoard tags such as `Loss/train`
        return canonical_name(key[: -len("/train")])
    return key


EVAL_SUFFIXES = ("/eval", "/val", "/valid", "/validation", "/test", "_val", "_eval")
"""...or ends like this (TensorBoard tags such as `Loss/val`)."""


def is_eval_name(name: str) -> bool:
    lowered = name.strip().lower()
    return lowered.startswith(EVAL_PREFIXES) or lowered.endswith(EVAL_SUFFIXES)


BEST = ("best_", "best ", "best/")
"""A best-so-far tracker's prefix (`best_mean_loss`, `best acc`): the running extreme of another
value, not a value of its own (`inf` before the first, by convention)."""


def is_bookkeeping(name: str) -> bool:
    lowered = name.strip().lower()
    return lowered in BOOKKEEPING or lowered.startswith(("train/train_", "train/total_flos",
                                                         "train/epoch", *BEST))


LOSS_WORDS = frozenset({"xent", "nll", "ce", "cross_entropy", "cross entropy", "cross-entropy",
                        "cost", "l1", "l2", "smoothl1", "smooth_l1", "epe"})
"""Names of a training loss without the word (OpenNMT's `xent`, Marian's `Cost` and its
validation `cross-entropy`, a super-resolution trainer's `[L1: 5.96]`, an optical-flow
trainer's end-point error `epe`: the loss function's own name)."""


def is_train_loss(name: str) -> bool:
    """A training-loss series other than `loss` itself (`loss_total`, `mlm loss`, `xent`,
    BasicSR's `l_pix`)."""
    lowered = name.lower()
    if name == LOSS or is_eval_name(name) or is_bookkeeping(name) or "scale" in lowered:
        return False
    return "loss" in lowered or lowered in LOSS_WORDS or lowered.startswith("l_")

Points = tuple[list[int], list[float]]
"""The rows that hold a series (ascending, each once) and its values there."""


class Series(MutableMapping[str, list[float | None]]):
    """A log's series by name, each a list of one value per row (None where a row does not hold
    it) when read. Kept as the rows holding it and their values until a name is read, so that
    memory follows the values a log holds, not its rows times its names; a series read once
    stays laid out (the detectors read the loss, the grad norm and the LR row by row)."""

    __slots__ = ("_entries", "rows")

    def __init__(self, rows: int, dense: Mapping[str, list[float | None]] | None = None) -> None:
        self.rows = rows
        self._entries: dict[str, list[float | None] | Points] = dict(dense or {})

    def set_points(self, name: str, rows: list[int], values: list[float]) -> None:
        """The series `name` holds `values[k]` at row `rows[k]` (ascending, each row once)."""
        if len(rows) == self.rows:  # on every row: its values are its layout
            self._entries[name] = values  # type: ignore[assignment]
        else:
            self._entries[name] = (rows, values)

    def points(self, name: str) -> Points:
        """The rows that hold a value of `name` and those values, without laying it out."""
        entry = self._entries[name]
        if isinstance(entry, tuple):
            return entry
        rows = [i for i, v in enumerate(entry) if v is not None]
        return rows, [entry[i] for i in rows]  # type: ignore[misc]

    def holds(self, name: str) -> bool:
        """Whether some row holds a value of `name`."""
        entry = self._entries.get(name)
        if entry is None:
            return False
        if isinstance(entry, tuple):
            return bool(entry[0])
        return any(v is not None for v in entry)

    def laid_out(self, name: str) -> bool:
        """Whether `name` is held as one value per row (read, or on every row), not as points."""
        return not isinstance(self._entries[name], tuple)

    def rename(self, old: str, new: str) -> None:
        """`old` read as `new` (moved to the end, as a dict's pop and insert would)."""
        self._entries[new] = self._entries.pop(old)

    def copy(self) -> Series:
        """A shallow copy: the values are shared, names set or deleted are its own."""
        out = Series(self.rows)
        out._entries = dict(self._entries)
        return out

    def __getitem__(self, name: str) -> list[float | None]:
        entry = self._entries[name]
        if isinstance(entry, tuple):
            column: list[float | None] = [None] * self.rows
            for at, value in zip(*entry, strict=True):
                column[at] = value
            self._entries[name] = entry = column
        return entry

    def __setitem__(self, name: str, values: list[float | None]) -> None:
        self._entries[name] = values

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Series({self.rows} rows: {', '.join(list(self._entries)[:8])})"


@dataclass(slots=True)
class Log:
    """The training rows of one log, in the log's own step units."""

    path: str
    format: str
    """The reader that read it (a name of `trainguard.analyze.FORMATS`)."""
    steps: list[int]
    """The log's step of each training row (HF `step`, Megatron `iteration`, a global batch)."""
    series: Series
    """Per series, one value per row: None where the row does not hold it (a logged NaN or inf
    is kept as such). A plain dict of such lists is taken too."""
    labels: list[str] | None = None
    """How the log itself names each row ("epoch 4, batch 1400"), when not by its step."""
    skipped: list[bool] | None = None
    """Rows the log says the optimizer skipped (an overflow message, a skipped-iterations
    counter, a GradScaler overflow in a trainguard store)."""
    evals: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    """Evaluations: (step, metrics)."""
    step_unit: str = "step"
    notes: list[str] = field(default_factory=list)
    """What the reader interpreted (a truncated last record, a grad norm that is 0 throughout)."""
    param_names: list[str] = field(default_factory=list)
    """Per-parameter gradient norms, where the log holds them (a trainguard store)."""
    param_grad_norms: Any = None
    """A rows x parameters array of gradient norms, or None."""
    detector_config: dict[str, Any] | None = None
    """The detector thresholds the run itself used, where the log records them (a store)."""
    loss_curvature: list[float | None] | None = None
    """The live run's own loss curvature per row, where the log records it (a store)."""
    from_start: bool | None = None
    """Whether the log begins at the start of training, where the reader can tell (a pasted
    excerpt whose first row is at epoch 0.24 does not); None: judged from its first step."""
    own_verdict: dict[str, Any] | None = None
    """The run's own verdict at its close, where the log records it (a trainguard store: the
    live `RunVerdict`'s `verdict` and `message`, its levels and first trouble step where they
    are numbers)."""
    own_events: list[Event] = field(default_factory=list)
    """The events the live run raised, where the log records them (a trainguard store)."""
    loss_is_evaluation: bool = False
    """The loss judged is an evaluation's (the log holds no training loss): each value is a
    mean over a whole evaluation set, the model's state at that step, not one batch's noise."""
    row_span: int = 1
    """How many of the log's rows each row stands for: more than 1 for a long log read in
    windows (`analyze/windows.py`), whose rows are means that hide the batch noise."""
    single_batch: bool = False
    """Each row's loss is one batch's (printed beside its running average), not the mean of the
    steps since the last row: as noisy as a live step, however far apart the rows are."""
    loss_from: str | None = None
    """The series read as the loss, where the log names none `loss` (`total_loss`, a GAN's
    `loss_D_A`: `choose_loss`); None when the log names its loss so."""

    def __post_init__(self) -> None:
        if not isinstance(self.series, Series):
            self.series = Series(len(self.steps), self.series)

    def __len__(self) -> int:
        return len(self.steps)

    def has(self, name: str) -> bool:
        return self.series.holds(name)

    def values(self, name: str) -> list[float | None]:
        return self.series[name] if name in self.series else [None] * len(self.steps)

    def loss_set_aside(self, name: str, note: str) -> Log:
        """The log with its loss renamed `name`, a further training loss (watched for NaN and
        inf, its level not judged), and `note` added (a copy); the log itself when it holds
        no loss or a series `name` already."""
        if not self.has(LOSS) or name in self.series:
            return self
        series = self.series.copy()
        series.rename(LOSS, name)
        return dataclasses.replace(self, series=series, notes=[*self.notes, note])

    def went(self, name: str) -> str | None:
        """`name went from A to B`: the series' first and last finite values (None: none)."""
        _, values = self.series.points(name)
        finite = [v for v in values if math.isfinite(v)]
        return f"{name} went from {finite[0]:.4g} to {finite[-1]:.4g}" if finite else None

    def label(self, row: int) -> str:
        """The row as the log names it: `step 3010`, `iteration 7010`, `epoch 4, batch 1400`."""
        if self.labels is not None and self.labels[row]:
            return self.labels[row]
        return f"{self.step_unit} {self.steps[row]}"

    def starts_at_start(self) -> bool:
        """The first row is at the start of training (within two logging intervals of step
        0), as far as the log tells."""
        if self.from_start is not None:
            return self.from_start
        return bool(self.steps) and self.steps[0] <= 2 * self.interval()

    def interval(self) -> float:
        """The logging interval: the median distance between consecutive rows, in steps."""
        gaps = sorted(b - a for a, b in zip(self.steps, self.steps[1:], strict=False) if b > a)
        if not gaps:
            return 1.0
        return float(gaps[len(gaps) // 2])


class LogBuilder:
    """Collects rows as a reader finds them; values of one step (several records of one HF log
    step, a TensorBoard step written tag by tag) are merged into one row."""

    def __init__(self, path: str | Path, fmt: str, *, step_unit: str = "step") -> None:
        self.path = str(path)
        self.format = fmt
        self.step_unit = step_unit
        self._index: dict[int, int] = {}
        self._steps: list[int] = []
        self._rows: list[dict[str, float]] = []
        self._labels: list[str] = []
        self._skipped: list[bool] = []
        self.evals: dict[int, dict[str, float]] = {}
        self.notes: list[str] = []
        self._kinds: dict[str, tuple[int, str]] = {}
        self.from_start: bool | None = None
        self.single_batch = False
        self.loss_is_evaluation = False
        self.rows_are_evaluations = False
        """The reader found evaluations only and made them the rows: the training lines of
        another grammar in the same file, if it reads more of them, tell more of the run."""
        self._plans: dict[tuple[str, ...], list[tuple[str, int, str]]] = {}
        self._evals_halved = False
        self._windows: list[windows.Window] | None = None
        """Past `windows.MAX_ROWS` * 2 rows: the rows summed up in windows (`windows.py`),
        each of `stride` rows, the last one still filling."""
        self.stride = 1

    def add(self, step: int, values: Mapping[str, float], *, label: str = "",
            skipped: bool = False) -> None:
        """A training row (or more values of a row already seen at this step)."""
        if self._windows is not None:
            self._add_to_windows(step, values, label, skipped)
            return
        at = self._index.get(step)
        if at is None:
            self._index[step] = len(self._steps)
            self._steps.append(step)
            self._rows.append(dict(values))
            self._labels.append(label)
            self._skipped.append(skipped)
            if len(self._steps) >= 2 * windows.MAX_ROWS:
                self._to_windows()
            return
        self._rows[at].update(values)
        self._skipped[at] = self._skipped[at] or skipped
        if label and not self._labels[at]:
            self._labels[at] = label

    def add_eval(self, step: int, metrics: Mapping[str, float]) -> None:
        if metrics:
            self.evals.setdefault(step, {}).update(metrics)
            if len(self.evals) >= 2 * windows.MAX_EVALS:
                self.evals = windows.halve_evals(self.evals)
                self._evals_halved = True

    def _to_windows(self) -> None:
        """The rows so far summed up in windows of two: the log is longer than rows are kept."""
        rows = [windows.row(values, step, label, skipped) for values, step, label, skipped
                in zip(self._rows, self._steps, self._labels, self._skipped, strict=True)]
        self._rows, self._steps, self._labels, self._skipped = [], [], [], []
        self._index = {}
        self._windows = windows.halve(rows, WINDOW_RULES, LOSS)
        self.stride = 2

    def _add_to_windows(self, step: int, values: Mapping[str, float], label: str,
                        skipped: bool) -> None:
        held = self._windows
        assert held is not None
        last = held[-1]
        row = windows.row(values, step, label, skipped)
        if last.last[0] == step:  # more values of the row just added: no row of its own
            row.rows = row.skips = 0
            last.absorb(row, WINDOW_RULES, LOSS)
            return
        if last.rows < self.stride:
            last.absorb(row, WINDOW_RULES, LOSS)
            return
        held.append(row)
        if len(held) >= 2 * windows.MAX_ROWS:
            self._windows = windows.halve(held, WINDOW_RULES, LOSS)
            self.stride *= 2

    def add_values(self, step: int, values: Iterable[tuple[str, Any]], *, label: str = "",
                   skipped: bool = False) -> None:
        """Sort named values into the training row and the evaluation of `step`: numbers only,
        bookkeeping left out, names made canonical."""
        row: dict[str, float] = {}
        evals: dict[str, float] = {}
        kinds = self._kinds
        for name, raw in values:
            kind = kinds.get(name)
            if kind is None:
                kind = kinds[name] = _classify(name)
            if kind[0] == _IGNORE:
                continue
            kind_of = type(raw)
            if kind_of is float or kind_of is int:
                value: float | None = float(raw)
            else:
                value = number(raw)
                if value is None:
                    continue
            if kind[0] == _TRAIN:
                row[kind[1]] = value  # type: ignore[assignment]
            else:
                evals[kind[1]] = value  # type: ignore[assignment]
        if row:
            self.add(step, row, label=label, skipped=skipped)
        if evals:
            self.add_eval(step, evals)

    def add_entry(self, step: int, entry: Mapping[str, Any], *, label: str = "",
                  skipped: bool = False) -> None:
        """`add_values` for one record (a dict), its names sorted once per set of names: the
        fast path for logs of a hundred thousand records."""
        names = tuple(entry)
        plan = self._plans.get(names)
        if plan is None:
            kinds = self._kinds
            plan = []
            for name in names:
                sort = kinds.get(name)
                if sort is None:
                    sort = kinds[name] = _classify(name)
                if sort[0] != _IGNORE:
                    plan.append((name, *sort))
            if len(self._plans) < _PLANS:  # records of names of their own are not cached
                self._plans[names] = plan
        row: dict[str, float] = {}
        evals: dict[str, float] | None = None
        for name, kind, target in plan:
            raw = entry[name]
            kind_of = type(raw)
            if kind_of is float or kind_of is int:
                value: float | None = float(raw)
            else:
                value = number(raw)
                if value is None:
                    continue
            if kind == _TRAIN:
                row[target] = value  # type: ignore[assignment]
            else:
                if evals is None:
                    evals = {}
                evals[target] = value  # type: ignore[assignment]
        if row:
            self.add(step, row, label=label, skipped=skipped)
        if evals:
            self.add_eval(step, evals)

    def __len__(self) -> int:
        return len(self._steps) if self._windows is None else len(self._windows)

    def _from_windows(self) -> None:
        """The windows as the rows of the log, named by the rows they hold."""
        held = self._windows
        assert held is not None
        self._rows = [w.values for w in held]
        self._steps = [w.step for w in held]
        self._labels = [windows.label(w, self.step_unit) for w in held]
        self._skipped = [w.skipped() for w in held]
        self.notes.append(windows.note(sum(w.rows for w in held), self.stride))
        self._windows = None

    def build(self, *, what: str = "training values") -> Log:
        if self._windows is not None:
            self._from_windows()
        if self._evals_halved:
            self.notes.append(windows.EVALS_NOTE)
        if not self._steps:
            raise LogError(f"{self.path}: no {what} found")
        out_of_range = next((s for s in (min(self._steps), max(self._steps))
                             if not -MAX_STEP <= s < MAX_STEP), None)
        if out_of_range is not None:
            raise LogError(f"{self.path}: step {out_of_range} is beyond any training step "
                           f"(|step| < 2^63 is read)")
        # one pass over the values: each series as its rows and values (a rows x names table
        # would grow with the square of a log whose names each appear on a few rows)
        points: dict[str, Points] = {}
        for at, row in enumerate(self._rows):
            for name, value in row.items():
                pair = points.get(name)
                if pair is None:
                    pair = points[name] = ([], [])
                pair[0].append(at)
                pair[1].append(value)
        series = Series(len(self._rows))
        for name, (rows, values) in points.items():
            series.set_points(name, rows, values)
        del points
        loss_from = choose_loss(series, self.notes)
        choose_lr(series, self.notes)
        labels = self._labels if any(self._labels) else None
        skipped = self._skipped if any(self._skipped) else None
        return Log(path=self.path, format=self.format, steps=list(self._steps), series=series,
                   labels=labels, skipped=skipped,
                   evals=sorted(self.evals.items()), step_unit=self.step_unit,
                   notes=list(self.notes), from_start=self.from_start,
                   loss_is_evaluation=self.loss_is_evaluation, row_span=self.stride,
                   single_batch=self.single_batch, loss_from=loss_from)


def _stand_in(series: Series, notes: list[str], canonical: str, fits: Callable[[str], bool],
              role: str) -> str | None:
    """A log without the series `canonical` reads its first series that `fits` as it, and says
    so; returns that series' name (None: none read so)."""
    if canonical in series:
        return None
    name = next((name for name in series if fits(name)), None)
    if name is not None:
        series.rename(name, canonical)
        notes.append(f"{name} is read as {role}")
    return name


_TOTAL = re.compile(r"(?<![a-z])total(?![a-z])")


def choose_loss(series: Series, notes: list[str]) -> str | None:
    """A log without a series named as the training loss reads another training-loss series
    as the loss, and says so: a total where the log has one (`total_loss`, `Loss/total_loss`,
    `loss/train/total`: the sum of the terms, what the optimizer minimises), else the first
    (`data_loss`)."""
    totals = [name for name in series if is_train_loss(name) and _TOTAL.search(name.lower())]
    return _stand_in(series, notes, LOSS, (lambda name: name == totals[0]) if totals
                     else is_train_loss, "the training loss")


def is_part_lr(name: str) -> bool:
    """The LR of one part or parameter group, an LR's name with one level below it: sd-scripts'
    `lr/unet` and `lr/textencoder`, Lightning's `lr-AdamW/pg1`."""
    head, slash, part = name.strip().partition("/")
    return bool(slash and part and "/" not in part and canonical_name(head) == LR)


def choose_lr(series: Series, notes: list[str]) -> None:
    """A log without the run's LR, but with its parts' (one per parameter group), reads the first
    part's as the LR, and says so: the schedule and its warmup are read from it."""
    _stand_in(series, notes, LR, is_part_lr, "the learning rate")


WINDOW_RULES = {GRAD_NORM: windows.LARGEST, LOSS_SCALE: windows.SMALLEST, LR: windows.LAST}
"""How a window of a long log sums up its rows' values (the others: their mean)."""

_IGNORE, _TRAIN, _EVAL = 0, 1, 2
_PLANS = 1024
"""Sets of record names whose sorting `LogBuilder.add_entry` keeps."""


def _classify(name: str) -> tuple[int, str]:
    if is_bookkeeping(name):
        return _IGNORE, name
    if is_eval_name(name):
        return _EVAL, name.strip()
    return _TRAIN, canonical_name(name)


def whole_number(value: object) -> TypeGuard[int]:
    """A whole number as JSON writes one (`4`, not `4.5`, not `true`)."""
    return isinstance(value, int) and not isinstance(value, bool)


def number(raw: Any) -> float | None:
    """A logged value as a float (NaN and inf kept); None for anything that is not a number."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, (int, float)):
        return float(raw)
    if isinstance(raw, str):
        text = raw.strip().rstrip("%")
        try:
            return float(text)
        except ValueError:
            return None
    return None
