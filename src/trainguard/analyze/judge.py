"""The verdict on a logged run: healthy, recovered or degraded (the live verdict's words,
`trainguard.vocabulary.Verdict`); its kind and its onset.

The detectors say *that* something went wrong, at the row where they could tell. The judgement
reads their events with hindsight, the whole log in view:

1. **Transient jumps are not trouble.** A `loss_spike` or `grad_explosion` whose next row (one
   logging interval later) is back below the detector's own threshold is what heavy-tailed data
   does; the live detectors call such jumps transient too (`signals.TransientJumps`). So is one
   on the last row, which nothing after it confirms, unless the loss is an evaluation's (a mean
   over the whole evaluation set says where the model is). They stay in the evidence, marked
   isolated. A loss that left its level by orders of magnitude (`FAR`x, beyond the noise of a
   loss near its floor) is never transient: no heavy-tailed batch does that.
2. **The incident** is the first remaining event of warning severity or worse, or the loss going
   back to chance level (`trainguard.analyze.chance`), whichever comes first.
3. **Its onset** is traced back from where it was detected, in the signal that raised it: for a
   loss event, over the preceding rows whose loss is `detectors.loss_spike.ratio` times the lowest
   loss of the rows before or more; for a gradient event, over the rows whose norm is
   `detectors.grad_explosion.abs_min_ratio` times the lowest norm before or more; for a
   divergence, from where the detector says its level crossed; for the first updates' blow-up
   (`bad_start`), from the first row above its bound; for non-finite values and
   skipped steps, over the unbroken run of non-finite or skipped rows that leads into them. In
   a log from the start of training, a jump is not traced back into its first `LEVEL_ROWS`
   rows (a fresh model's first losses are no level to stand above). It is then moved to the
   first earlier incident of the same kind that the run came back from, if any: a run is told
   from its first blow-up of the kind reported.
4. **Degraded or recovered.** The run degraded when it ends non-finite, when it ends skipping
   most steps since the onset, or when its final loss level (the median of its last 20 steps, or
   its last row when rows are further apart) is worse than its level before the onset (the
   median of up to `baseline_window` rows) by the live verdict's rule
   (`trainguard.verdict.ended_worse`: 10% and beyond the final window's noise, or twice the
   level whatever the end's own noise) and, a log's final rows being few, by more than
   `NOISE_Z` robust deviations of the row-to-row swings before the onset (one batch's losses
   logged every step swing by 2x and more on a healthy run; the end is then said to be within
   those swings, not back), or when it went back to chance level, unless it is visibly on its
   way back (its loss fell on every row from its peak to the end of the log, over three rows or
   more). Trouble from the first logged row has no level to come back to: the run degraded,
   unless it was a non-finite loss on the first rows only, the loss finite on every row after
   and lower at the end (a first cost of inf from a saturating initialisation): recovered.
   So did a run whose only trouble is an evaluation metric fallen off a cliff that no later
   evaluation shows back within the cliff's bound of its best: the training loss, which never
   showed the trouble, cannot say it passed (unless the metric swung as far before and came
   back, or its evaluation's own loss held its level: no collapse of the model).
   A run that ended no worse is healthy when its only trouble was the evaluations', passed, or
   its first losses standing far above the level it settled at (`bad_start` alone): the
   verdict needs the loss or the task's metric to say so.
   Otherwise the spike was recovered, unless its jumps took back less than a tenth of what the
   loss had come down from its start (`NEGLIGIBLE_SHARE`: a loss near its floor, where one odd
   batch is a large ratio and a small loss): then the run is healthy.
5. **The kind**: `nan` for non-finite values or steps skipped to the end; `collapse` for trouble
   only the evaluations or a frozen loss show; `explosion` when within three rows of the onset
   the loss jumped from one row to the next by the spike detector's default ratio (2.5x), unless
   the jump (of less than orders of magnitude) was the first step of a climb (rising on three
   rows in four after it, to 2.5x the value it jumped to or more), or the signal that raised
   the alarm (the loss, or the gradient norm) got at least halfway (in log space) from its
   level before to its peak; `slow-divergence` when it climbed.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from dataclasses import dataclass, field
from typing import TypeGuard

from trainguard.analyze import resolution
from trainguard.analyze.chance import AtChance
from trainguard.analyze.log import GRAD_NORM, LOSS, Log
from trainguard.analyze.quirks import whole_interval_skips
from trainguard.config import DetectorConfig
from trainguard.detect.metric_collapse import lower_is_better, within_cliff
from trainguard.events import Event, at_least
from trainguard.registry import Kind
from trainguard.signals import MAD_TO_STD
from trainguard.verdict import DEGRADED_RATIO, WINDOW, ended_worse, times
from trainguard.vocabulary import DEGRADED, HEALTHY, RECOVERED, Verdict

NAN, EXPLOSION, SLOW, COLLAPSE = "nan", "explosion", "slow-divergence", "collapse"
JUMPS = ("loss_spike", "grad_explosion")
LOSS_KINDS = ("loss_spike", "bad_start", "loss_divergence", "loss_at_chance",
              "loss_above_chance")
NONFINITE_KINDS = ("nonfinite_loss", "nonfinite_grad", "nonfinite_value")
RECOVERING_ROWS = 3
SUDDEN_ROWS = 3
RAMP_SHARE = 0.75
"""A climb is a ramp when the loss rises on this share of its rows to its peak or more (a loss
that runs wild jumps up and down on its way)."""
LEVEL_ROWS = 3
"""Rows from the start of training that show a level: a row with fewer before it cannot be told
to stand above them."""
BACK_ROWS = 3
"""Rows in a row at the old level that say a run came back from an incident."""
CLUES = ("lr_change",)
"""Events that say why, not that the run is in trouble: causes' evidence, never an incident."""
START_ROWS = 5
"""The loss's level at the start: the median of its first rows."""
NEGLIGIBLE_SHARE = 0.1
"""A recovered jump of the loss that takes back less than this share of what the loss had come
down from its start is noise near its floor, not trouble (chosen on the tuning half of the real
logs: a healthy run's one-batch jumps took back 2% of its fall there; every degraded run with a
level before its trouble took back more than its whole fall)."""
SMALL_JUMP = 1.5
"""A loss that came back from jumps to under this many times its level did not spike: a bump
(an epoch's mean a few percent above the one before, which the log's averaged rows let the spike
detector see) is no incident a run is told by. Chosen on the tuning half of the real logs: a
healthy run's recovered bump stood 1.07x its level, every run labelled spike-recovered jumped
2x or more."""
FAR = DetectorConfig().loss_spike.error_ratio
"""A loss this many times its level (two orders of magnitude: the ratio at which the spike
detector calls a jump an error) has left it: never a transient jump, never healthy."""
EVAL_LOSS_HELD = 1.25
"""An evaluation loss at most this many times its best so far held its level (a cliff in
another metric of the same evaluation is then no collapse of the model)."""
SUDDEN_JUMP = DetectorConfig().loss_spike.ratio
"""A loss that jumps this many times its previous row's value is sudden, whatever the logging
interval (a slow climb moves by a fraction per row; a mean over many steps dilutes a one-step
spike, not a jump that stays)."""


@dataclass(slots=True)
class Judgement:
    verdict: Verdict
    kind: str | None
    onset_row: int | None
    incident: list[Event] = field(default_factory=list)
    """The events from the onset on (what the causes are ranked from)."""
    isolated: list[Event] = field(default_factory=list)
    """Transient jumps, not counted as trouble."""
    reference: float | None = None
    """The loss level before the onset."""
    final: float | None = None
    """The loss level at the end of the log."""
    ending: str = ""
    """How the log ends, in words."""
    earlier: list[Event] = field(default_factory=list)
    """Events of incidents before the one that decides, which the run came back from."""
    back: int | None = None
    """The row by which the loss was back at its level after the incident that decides (None:
    it never was, or there is no incident)."""


def judge(log: Log, rows: list[int], events: list[Event], config: DetectorConfig,
          chance: AtChance | None = None) -> Judgement:
    """`rows`: the rows the detectors were run on (those holding a training value)."""
    passed: list[tuple[Event, int, float | None]] = []
    judgement, earlier = _judge(log, rows, events, config, chance, passed)
    judgement.earlier = earlier
    _first_of_its_kind(judgement, passed, log, rows, events, config)
    if judgement.incident and judgement.onset_row is not None:
        skipped = log.skipped or [False] * len(log.steps)
        judgement.back = _came_back(judgement.incident[0], judgement.onset_row,
                                    judgement.reference, rows, log.values(LOSS),
                                    log.values(GRAD_NORM), skipped)
    return judgement


def _judge(log: Log, rows: list[int], events: list[Event], config: DetectorConfig,
           chance: AtChance | None, passed: list[tuple[Event, int, float | None]]
           ) -> tuple[Judgement, list[Event]]:
    losses = log.values(LOSS)
    grads = log.values(GRAD_NORM)
    skipped = log.skipped or [False] * len(log.steps)
    isolated, trouble = _trouble(log, rows, events, config, chance)
    if not trouble:
        return Judgement(HEALTHY, None, None, isolated=isolated,
                         ending=_ending_healthy(losses, rows)), []
    first, onset, reference, trouble, earlier = _deciding(log, rows, trouble, config, passed)
    incident = [e for e in trouble if e.details["row"] >= onset]
    after = [i for i in rows if i >= onset]
    whole = whole_interval_skips(log, skipped)
    nonfinite_end, skipping_end = _bad_end(after, losses, grads, skipped, whole)
    kinds = {e.kind for e in incident}
    nonfinite_end = nonfinite_end or _term_ends_nonfinite(log, incident, kinds)
    final_rows = [v for i in after if _finite(v := losses[i])]
    end = log.steps[after[-1]] if after else 0
    span = max(WINDOW, log.interval())  # the live verdict's last 20 steps, or the last row
    tail = [v for i in after if _finite(v := losses[i]) and log.steps[i] > end - span]
    final = statistics.median(tail) if tail else None
    if kinds & set(NONFINITE_KINDS) or skipping_end or _nonfinite_evaluation_loss(incident):
        kind = NAN
    elif kinds <= {"metric_collapse"} or (_frozen(final_rows) and not _risen(
            final_rows[-1], reference, config)):
        kind = COLLAPSE  # frozen where it was: a constant prediction, not a blow-up
    else:
        kind = _blowup_kind(log, rows, first, onset, reference, config)
    if nonfinite_end or skipping_end:
        ending = ("the log ends with non-finite values" if nonfinite_end else
                  "the optimizer skipped most steps from the onset to the end of the log")
        return (Judgement(DEGRADED, kind, onset, incident, isolated, reference, final, ending),
                earlier)
    if reference is None and (trained_on := _nonfinite_start_passed(incident, after, losses)):
        return (Judgement(RECOVERED, kind, onset, incident, isolated, reference, final,
                          trained_on), earlier)
    if reference is None:
        ending = (f"the trouble starts at the first logged row, with no healthy level before "
                  f"it; the loss ends at {_fmt(final)}")
        return (Judgement(DEGRADED, kind, onset, incident, isolated, reference, final, ending),
                earlier)
    if final is None:
        return Judgement(DEGRADED, kind, onset, incident, isolated, reference, final,
                         "no finite loss after the onset"), earlier
    if kinds <= {"metric_collapse"} and (lasting := _collapse_lasts(log, incident)):
        # the evaluations, not the loss, showed the trouble: they say whether it passed
        return (Judgement(DEGRADED, kind, onset, incident, isolated, reference, final, lasting),
                earlier)
    worse = _worse(final, reference, tail, losses, [i for i in rows if i < onset], config)
    if chance is not None and chance.row >= onset:
        worse = True
    if not worse and all(e.kind == Kind.GRAD_EXPLOSION for e in incident):
        # the loss, not the norm, says whether a run is in trouble: a norm that jumps while
        # the loss keeps its course (batch size 1, a regression head) is worth a note only
        ending = (f"{_ending_healthy(losses, rows)}; the gradient norm jumped from "
                  f"{log.label(onset)} ({len(incident)} event(s)) and the loss was not hurt: "
                  "a note, not a verdict")
        return Judgement(HEALTHY, None, None, isolated=isolated, ending=ending), earlier
    if not worse and (passing := _passing(kinds, incident)) is not None:
        return Judgement(HEALTHY, None, None, isolated=isolated + incident,
                         ending=_ending_healthy(losses, rows) + "; " + passing), earlier
    if not worse:
        negligible = _negligible(incident, log, rows, reference)
        if negligible is not None:
            return Judgement(HEALTHY, None, None, isolated=isolated + incident,
                             ending=_ending_healthy(losses, rows) + "; " + negligible), earlier
        ending = _ending_no_worse(final, reference)
        return (Judgement(RECOVERED, kind, onset, incident, isolated, reference, final, ending),
                earlier)
    if _recovering(after, losses):
        ending = (f"the loss ends at {_fmt(final)}, above the {_fmt(reference)} before the "
                  f"trouble but falling on each of its last rows since its peak: recovering")
        return (Judgement(RECOVERED, kind, onset, incident, isolated, reference, final, ending),
                earlier)
    ending = (f"the loss ends at {_fmt(final)}, {times(final, reference)} the {_fmt(reference)} "
              "it was before the trouble")
    return (Judgement(DEGRADED, kind, onset, incident, isolated, reference, final, ending),
                earlier)


def _nonfinite_evaluation_loss(incident: list[Event]) -> bool:
    """An evaluation loss (or perplexity) of the incident was NaN or inf: the model's own
    forward pass on held-out data overflowed, which is a NaN in the weights or the activations,
    not a model that collapsed to a constant prediction (an accuracy's cliff)."""
    return any(e.kind == "metric_collapse" and e.details.get("rule") == "nonfinite"
               and _names_a_loss(str(e.details.get("metric", ""))) for e in incident)


_LOSS_WORDS = frozenset({"loss", "nll", "perplexity", "ppl"})


def _names_a_loss(name: str) -> bool:
    """A metric named as a loss or a perplexity, by whole word (`eval_loss`, `val/ppl`, not
    `eval_answer_accuracy`, whose `wer` a substring test would find)."""
    return any(word in _LOSS_WORDS for word in re.split(r"[^a-z0-9]+", name.lower()))


def _worse(final: float, reference: float, tail: list[float], losses: list[float | None],
           before: list[int], config: DetectorConfig) -> bool:
    """The live verdict's rule of an end worse than the level before the trouble, by more than
    the log's rounding (a loss written to few decimals ends "2x" its level by one unit of its
    last digit, 0.0002 against 0.0001) and beyond the noise of the rows `before` the trouble
    (`_within_its_noise`)."""
    return ended_worse(final, reference, tail) and not resolution.below_resolution(
        final - reference, resolution.quantum(losses)) and not _within_its_noise(
        final, reference, [v for i in before if _finite(v := losses[i])], config)


def _ending_no_worse(final: float, reference: float) -> str:
    """How a run that ended no worse than before the trouble ended, in words."""
    if final <= DEGRADED_RATIO * reference:
        return (f"the loss ends at {_fmt(final)}, back to the {_fmt(reference)} it was before "
                "the trouble")
    return (f"the loss ends at {_fmt(final)}, {times(final, reference)} the {_fmt(reference)} "
            "before the trouble but within the swings of the rows before it")


NOISE_Z = 3.0
"""Robust deviations of the rows before the trouble that the end must rise beyond."""
NOISE_ROWS = 4
"""Rows before the trouble needed to measure their noise."""


def _within_its_noise(final: float, reference: float, before: list[float],
                      config: DetectorConfig) -> bool:
    """Whether the end's rise over the level before the trouble is within `NOISE_Z` robust
    deviations of the rows before it, on a log scale, measured from row to row (so a trend is
    no noise): one batch's losses logged every step
    (0.83, 0.28, 0.39, 0.22) swing by more than 2x while the run is healthy, and the median of
    a few such rows after a spike is no level of its own. A log of means, whose rows barely
    move, is untouched."""
    window = [v for v in before[-max(config.common.baseline_window, 1):] if v > 0]
    if len(window) < NOISE_ROWS or final <= 0 or reference <= 0:
        return False
    # the swing from row to row, not the spread of the levels: a loss still falling fast has
    # levels far apart and little noise
    steps = [math.log(b / a) for a, b in itertools.pairwise(window)]
    centre = statistics.median(steps)
    spread = MAD_TO_STD * statistics.median(abs(d - centre) for d in steps) / math.sqrt(2)
    return math.log(final / reference) <= NOISE_Z * spread


def _passing(kinds: set[str], incident: list[Event]) -> str | None:
    """Why an incident the run ended no worse from is no trouble, if it is not: only the
    evaluations showed it, and they came back, or only an evaluation loss rose while the
    training loss fell (overfitting; a cliff that lasts is `_collapse_lasts`'s) (the training
    loss never did: the verdict needs the loss or the task's metric to say so, and neither
    says so at the end); or only the first losses stood far above where the run settled (a
    variational bound or a fresh head that starts at 1e10: the run fell from its first row and
    nothing broke)."""
    if kinds <= {"metric_collapse"}:
        if all(e.details.get("rule") == "rising" for e in incident):
            names = sorted({str(e.details.get("metric")) for e in incident})
            said = " and ".join(n if n.lower().startswith("eval") else f"eval {n}" for n in names)
            return (f"{said} rose while the training loss fell "
                    "(overfitting): a note, not a verdict")
        return ("the evaluations dipped and came back while the training loss kept its "
                "course: a note, not a verdict")
    if kinds <= {"bad_start"}:
        return ("the first losses stood far above the level the run settled at, and it kept "
                "that level: a start, not trouble")
    return None


def _nonfinite_start_passed(incident: list[Event], after: list[int],
                            losses: list[float | None]) -> str | None:
    """How a run whose only trouble is a non-finite loss on its first rows came back, if it
    did: every row after them finite (`RECOVERING_ROWS` or more), the loss lower at the end
    than on the first of them (a first cost of inf from a huge initialisation, then training
    as usual). None otherwise: trouble from the start that stays is no recovery."""
    if not incident or any(e.kind not in NONFINITE_KINDS for e in incident):
        return None
    bad = [i for i in after if not _finite(losses[i])]
    if not bad or bad != after[:len(bad)]:
        return None
    rest = [v for i in after[len(bad):] if (v := losses[i]) is not None]
    if len(rest) < RECOVERING_ROWS or not all(math.isfinite(v) for v in rest):
        return None
    if any(e.details["row"] > bad[-1] for e in incident) or not rest[-1] < rest[0]:
        return None
    return (f"the loss was non-finite on its first {len(bad)} row(s) only, then finite on all "
            f"{len(rest)} after, falling from {_fmt(rest[0])} to {_fmt(rest[-1])}")


def _collapse_lasts(log: Log, incident: list[Event]) -> str | None:
    """How an evaluation metric that fell off a cliff is still down at the log's last
    evaluation of it (None when each one came back within the cliff's bound of its best, or is
    no collapse of the model: a metric that swung as far before and came back, or whose
    evaluation's own loss held its level): a collapse nothing after it shows passing is no
    recovery, whatever the training loss did."""
    for event in incident:
        name, best = event.details.get("metric"), event.details.get("best")
        if event.details.get("rule") != "cliff" or name is None or not best:
            continue
        if _swung_before(log, event) or _eval_loss_held(log, event):
            continue
        after = log.steps[event.details["row"]]
        later = [m[name] for step, m in log.evals
                 if step > after and name in m and math.isfinite(m[name])]
        if any(within_cliff(name, value, best) for value in later):
            continue
        where = "its last evaluation" if not later else f"all {len(later)} evaluations after it"
        return (f"eval {name} is still off its best {best:.4g} at {where}: the evaluations "
                "show no recovery, whatever the training loss did")
    return None


def _off_best(name: str, value: float, best: float) -> float:
    """How far `value` is off `best`, as a factor >= 1 in the metric's bad direction (1 when
    it is not off it)."""
    if lower_is_better(name):
        return value / best if best > 0 and value > best else 1.0
    return best / value if value > 0 and value < best else (math.inf if best > 0 >= value
                                                            else 1.0)


def _swung_before(log: Log, event: Event) -> bool:
    """Whether the cliff's metric went as far off its best before, and came back within the
    cliff's bound of it: a metric that swings so (a noisy validation estimate) shows no
    collapse by swinging once more."""
    name, value = event.details["metric"], event.value
    at = log.steps[event.details["row"]]
    series = [(step, m[name]) for step, m in log.evals
              if step < at and name in m and math.isfinite(m[name])]
    if value is None or not series or not math.isfinite(value):
        return False
    now = _off_best(name, value, event.details["best"])
    best = series[0][1]
    swing: float | None = None  # the largest swing so far that has not yet come back
    for _, seen in series[1:]:
        off = _off_best(name, seen, best)
        if swing is not None and within_cliff(name, seen, best):
            if swing >= now:
                return True
            swing = None
        if off > 1.0 and not within_cliff(name, seen, best):
            swing = max(swing or 0.0, off)
        best = min(best, seen) if lower_is_better(name) else max(best, seen)
    return False


def _eval_loss_held(log: Log, event: Event) -> bool:
    """Whether a cliff in an evaluation metric other than a loss came at an evaluation whose
    own loss stayed within `EVAL_LOSS_HELD` of its best (a decoding or scoring artifact, not
    the model falling apart: the eval loss measures the model itself)."""
    name = event.details["metric"]
    if "loss" in name.lower():
        return False
    at = log.steps[event.details["row"]]
    evals = [(step, m) for step, m in log.evals if step <= at]
    if not evals or evals[-1][0] != at:
        return False
    losses = [k for k in evals[-1][1] if "loss" in k.lower() and lower_is_better(k)]
    for key in losses:
        before = [m[key] for step, m in evals[:-1] if key in m and math.isfinite(m[key])]
        now = evals[-1][1][key]
        if before and math.isfinite(now) and now <= EVAL_LOSS_HELD * min(before):
            return True
    return False


def _trouble(log: Log, rows: list[int], events: list[Event], config: DetectorConfig,
             chance: AtChance | None) -> tuple[list[Event], list[Event]]:
    """(isolated, trouble): the serious events that were one-step jumps the run shrugged off,
    and the others (with a loss at chance level), in row order."""
    serious = [e for e in events if at_least(e.severity, "warning") and e.kind not in CLUES]
    isolated = [e for e in serious if _transient(e, log, rows, config)]
    trouble = [e for e in serious if e not in isolated]
    if chance is not None:
        trouble.append(Event(kind="loss_at_chance", step=log.steps[chance.row], severity="error",
                             message=chance.describe(), value=chance.level,
                             details={"row": chance.row, "classes": chance.classes,
                                      "guessed": chance.guessed}))
    trouble.sort(key=lambda e: e.details["row"])
    return isolated, trouble


def _deciding(log: Log, rows: list[int], trouble: list[Event], config: DetectorConfig,
              passed: list[tuple[Event, int, float | None]]
              ) -> tuple[Event, int, float | None, list[Event], list[Event]]:
    """The incident that decides: the first one the run did not come back from. (Its first
    event, its onset row, the loss level before it, the trouble from it on, the events of the
    incidents the run came back from; `passed` gets the first event, onset and level before of
    each incident the run came back from.)"""
    losses = log.values(LOSS)
    grads = log.values(GRAD_NORM)
    skipped = log.skipped or [False] * len(log.steps)
    earlier: list[Event] = []
    passed.clear()
    while True:
        first = trouble[0]
        onset = _onset(first, log, rows, losses, grads, skipped, config)
        before = [v for i in rows if i < onset and _finite(v := losses[i])]
        reference = (statistics.median(before[-max(config.common.baseline_window, 1):]) if before
                     else None)
        back = _came_back(first, onset, reference, rows, losses, grads, skipped)
        if back is None:
            break
        later = [e for e in trouble if e.details["row"] > back]
        if not later:
            break
        earlier += [e for e in trouble if e.details["row"] <= back]
        passed.append((first, onset, reference))
        trouble = later
    return first, onset, reference, trouble, earlier


def _first_of_its_kind(judgement: Judgement, passed: list[tuple[Event, int, float | None]],
                       log: Log, rows: list[int], events: list[Event],
                       config: DetectorConfig) -> None:
    """The onset is the first incident of the kind the verdict reports: a run that blew up and
    came back before it blew up again, or spiked and recovered several times, is told from its
    first blow-up, the later ones in its evidence."""
    if judgement.verdict not in (DEGRADED, RECOVERED) or judgement.kind is None or not passed:
        return
    for first, onset, reference in passed:
        kind = (NAN if first.kind in NONFINITE_KINDS else
                _blowup_kind(log, rows, first, onset, reference, config))
        if kind != judgement.kind or first.kind not in (*JUMPS, *NONFINITE_KINDS):
            continue
        judgement.onset_row = onset
        judgement.incident = [e for e in judgement.earlier if e.details["row"] >= onset] + \
            judgement.incident
        judgement.earlier = [e for e in judgement.earlier if e.details["row"] < onset]
        return


def _blowup_kind(log: Log, rows: list[int], first: Event, onset: int,
                 reference: float | None, config: DetectorConfig) -> str:
    """A finite incident's kind: a jump, or the shape of the loss (of the gradient norm, for an
    explosion) after the onset."""
    losses = log.values(LOSS)
    grads = log.values(GRAD_NORM)
    after = [i for i in rows if i >= onset]
    series = grads if first.kind == Kind.GRAD_EXPLOSION else losses
    before_series = [v for i in rows if i < onset and _finite(v := series[i])]
    base = min(before_series[-max(config.common.baseline_window, 1):], default=None)
    jump = _jumped(after, losses, reference)
    if jump is not None:
        return SLOW if _climbed_on([i for i in after if i >= jump], losses, rows) else EXPLOSION
    return _shape(after, series, base if first.kind == Kind.GRAD_EXPLOSION else reference)


def _came_back(first: Event, onset: int, reference: float | None, rows: list[int],
               losses: list[float | None], grads: list[float | None],
               skipped: list[bool]) -> int | None:
    """The row by which the run was back from an incident (None if it never was): the last of
    `BACK_ROWS` consecutive rows after the event, finite and not skipped, whose median loss is
    within
    `DEGRADED_RATIO` of the level before the onset (for trouble from the first row, of the level
    at which it was seen)."""
    row = first.details["row"]
    level = reference
    if level is None:
        seen = [v for i in rows if onset <= i <= row and _finite(v := losses[i])]
        if not seen:
            return None
        level = statistics.median(seen)
    after = [i for i in rows if i > row]
    for k in range(len(after) - BACK_ROWS + 1):
        window = after[k:k + BACK_ROWS]
        values = [v for i in window if _finite(v := losses[i])]
        if len(values) < len(window):
            continue
        if any(skipped[i] or (grads[i] is not None and not _finite(grads[i])) for i in window):
            continue
        if statistics.median(values) <= DEGRADED_RATIO * level:
            return window[-1]
    return None


def _negligible(incident: list[Event], log: Log, rows: list[int],
                reference: float) -> str | None:
    """Why a recovered jump of the loss is no trouble, if it is not: it took back less than
    `NEGLIGIBLE_SHARE` of what the loss had come down from its start (a loss near its floor,
    0.001 going to 0.1 after starting at 12, jumps by large ratios on one odd batch)."""
    if not incident or any(e.kind not in (*JUMPS, "loss_divergence") or _far(e, log, rows)
                           for e in incident):
        return None
    if (small := _small_jumps(incident, log, rows)) is not None:
        return small
    losses = log.values(LOSS)
    start = _start_level(losses, rows)
    if start is None or start <= reference:
        return None
    first = incident[0].details["row"]
    last = incident[-1].details["row"]
    peak = max((v for i in rows if first <= i <= last + 1 and _finite(v := losses[i])),
               default=reference)
    if peak - reference >= NEGLIGIBLE_SHARE * (start - reference):
        return None
    return (f"the jumps after it (to {_fmt(peak)} at most) took back less than "
            f"{NEGLIGIBLE_SHARE:.0%} of its fall from {_fmt(start)} to {_fmt(reference)}: "
            "the noise of a loss near its floor")


def _small_jumps(incident: list[Event], log: Log, rows: list[int]) -> str | None:
    """Why loss jumps that came back are no trouble, when the loss never stood `SMALL_JUMP`
    times the level of the first one from its row to the end of the log (an episode's later,
    larger rows fold into its first event: the rows say how far it went). None when it did,
    or when an event is not a loss spike."""
    first = incident[0]
    level = first.details.get("baseline")
    if (not all(e.kind == Kind.LOSS_SPIKE for e in incident)
            or not isinstance(level, (int, float)) or not level > 0):
        return None
    losses = log.values(LOSS)
    since = [v for i in rows if i >= first.details["row"] and _finite(v := losses[i])]
    if not since or max(since) >= SMALL_JUMP * level:
        return None
    return (f"the loss stood {max(since) / level:.3g}x its level {_fmt(level)} at most and came "
            "back: a bump, not a spike")


def _finite(value: float | None) -> TypeGuard[float]:
    return value is not None and math.isfinite(value)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _next_row(log: Log, rows: list[int], row: int) -> int | None:
    """The next replayed row, when it is one logging interval (or less) later."""
    later = [i for i in rows if i > row]
    if not later:
        return None
    following = later[0]
    return following if log.steps[following] - log.steps[row] <= log.interval() else None


def _far(event: Event, log: Log, rows: list[int]) -> bool:
    """A jump of the loss by orders of magnitude (`FAR`x its level or more) that is more than
    the noise of a loss near its floor (`NEGLIGIBLE_SHARE` of its fall from the start): no
    heavy-tailed batch does that, back at the next row or not."""
    ratio, baseline, value = event.details.get("ratio"), event.details.get("baseline"), event.value
    if (event.kind != Kind.LOSS_SPIKE or not isinstance(ratio, (int, float)) or ratio < FAR
            or not isinstance(baseline, (int, float)) or not _finite(value)):
        return False
    start = _start_level(log.values(LOSS), rows)
    return start is None or value - baseline >= NEGLIGIBLE_SHARE * (start - baseline)


def _start_level(losses: list[float | None], rows: list[int]) -> float | None:
    finite = [v for i in rows if _finite(v := losses[i])]
    return statistics.median(finite[:START_ROWS]) if finite else None


def _transient(event: Event, log: Log, rows: list[int], config: DetectorConfig) -> bool:
    if event.kind not in JUMPS or _far(event, log, rows):
        return False
    row = event.details["row"]
    baseline = event.details.get("baseline")
    if row == rows[-1]:
        # the log ends on it: one batch's jump, that nothing after confirms; an evaluation's
        # mean over its whole set is the model's state at that step, confirmed by itself
        return not (log.loss_is_evaluation and event.kind == Kind.LOSS_SPIKE)
    following = _next_row(log, rows, row)
    if following is None or not isinstance(baseline, (int, float)) or baseline <= 0:
        return False
    if event.kind == Kind.LOSS_SPIKE:
        value = log.values(LOSS)[following]
        limit = baseline * config.loss_spike.ratio
    else:
        value = log.values(GRAD_NORM)[following]
        limit = baseline * config.grad_explosion.ratio
        loss_now, loss_before = log.values(LOSS)[row], _previous(log.values(LOSS), rows, row)
        if (_finite(loss_now) and _finite(loss_before) and loss_before > 0  # the loss moved too
                and loss_now >= config.loss_spike.ratio * loss_before):
            return False
    return _finite(value) and value < limit


def _previous(values: list[float | None], rows: list[int], row: int) -> float | None:
    earlier = [values[i] for i in rows if i < row and _finite(values[i])]
    return earlier[-1] if earlier else None


def _onset(first: Event, log: Log, rows: list[int], losses: list[float | None],
           grads: list[float | None], skipped: list[bool], config: DetectorConfig) -> int:
    row = first.details["row"]
    if first.kind == Kind.LOSS_DIVERGENCE and isinstance(first.details.get("crossed_row"), int):
        # where the detector's level crossed, moved on to the first row that is itself above
        limit = first.details.get("best", 0.0) * config.loss_divergence.ratio
        row = min(row, first.details["crossed_row"])
        while row < first.details["row"] and not (
                _finite(value := losses[row]) and value >= limit):
            row += 1
    position = rows.index(row) if row in rows else next(
        (k for k, i in enumerate(rows) if i >= row), len(rows) - 1)
    window = max(config.common.baseline_window, 1)

    def bad(i: int) -> bool:
        loss, grad = losses[i], grads[i]
        return skipped[i] or (loss is not None and not math.isfinite(loss)) \
            or (grad is not None and not math.isfinite(grad) and not skipped[i])

    if first.kind in NONFINITE_KINDS or first.kind == Kind.FP16_OVERFLOW:
        while position > 0 and bad(rows[position - 1]):
            position -= 1
        return rows[position]
    if first.kind in (Kind.LOSS_AT_CHANCE, Kind.LOSS_ABOVE_CHANCE):
        return row
    bound = first.details.get("bound")
    if first.kind == Kind.BAD_START and isinstance(bound, float):
        # the first updates' blow-up is judged once the run had time to settle, but it began
        # at the first row after the first loss that stands above the detector's bound
        return next((i for i in rows[1:position + 1]
                     if _finite(value := losses[i]) and value >= bound), row)
    series, ratio = ((grads, config.grad_explosion.abs_min_ratio)
                     if first.kind == Kind.GRAD_EXPLOSION
                     else (losses, config.loss_spike.ratio))
    start = position
    earlier = [v for i in rows[max(0, start - window):start] if _finite(v := series[i])]
    floor = min((v for v in earlier if v > 0), default=None)
    if floor is not None:
        # the first rows of training, from the model as it was initialised, are noisy: one
        # with fewer than `LEVEL_ROWS` rows before it has no level to stand above (an excerpt
        # from mid-run may have been cut where its trouble began)
        least = LEVEL_ROWS if log.starts_at_start() else 0
        while position > least:
            value = series[rows[position - 1]]
            if not (_finite(value) and value >= ratio * floor):
                break
            position -= 1
    while position > 0 and bad(rows[position - 1]):
        position -= 1
    return rows[position]


def _bad_end(after: list[int], losses: list[float | None], grads: list[float | None],
             skipped: list[bool], whole: list[bool]) -> tuple[bool, bool]:
    """(the log ends non-finite, the log ends skipping most steps since the onset); `whole`:
    the skipped rows that stand for their whole interval (`quirks.whole_interval_skips`)."""
    if not after:
        return False, False
    last_loss = next((losses[i] for i in reversed(after) if losses[i] is not None), None)
    last_grad = next((grads[i] for i in reversed(after) if grads[i] is not None
                      and not skipped[i]), None)
    nonfinite = ((last_loss is not None and not math.isfinite(last_loss))
                 or (last_grad is not None and not math.isfinite(last_grad)))
    skipping = whole[after[-1]] and sum(whole[i] for i in after) * 2 >= len(after)
    return nonfinite, skipping


def _term_ends_nonfinite(log: Log, incident: list[Event], kinds: set[str]) -> bool:
    """A value other than the loss ends the log non-finite: `nonfinite_value` (to the end, by
    its rule), or a term of the loss that went non-finite in the incident (`ODM_L Loss` beside
    the loss read as the training one) and is still so at its last row: the run never came
    back from it, whatever the other terms do."""
    if Kind.NONFINITE_VALUE in kinds:
        return True
    terms = {e.param for e in incident if e.kind == Kind.NONFINITE_LOSS and e.param}
    for name in terms & set(log.series):
        _, values = log.series.points(name)
        if values and not math.isfinite(values[-1]):
            return True
    return False


def _risen(final: float, reference: float | None, config: DetectorConfig) -> bool:
    """The loss ends far above its level before the trouble (a jump that then froze there is an
    explosion, as a loss that jumps to chance level and stays is)."""
    return reference is not None and reference > 0 and final > config.loss_spike.ratio * reference


def _frozen(values: list[float]) -> bool:
    """The loss is exactly the same on the last rows (a model predicting a constant)."""
    tail = values[-5:]
    return len(tail) >= 5 and len(set(tail)) == 1


def _jumped(after: list[int], losses: list[float | None], reference: float | None
            ) -> int | None:
    """The row at which the loss jumped `SUDDEN_JUMP` times its previous row's value within the
    first `SUDDEN_ROWS` rows of the incident (None: it did not)."""
    if reference is None or reference <= 0:
        return None
    previous = reference
    for i in after[:SUDDEN_ROWS]:
        value = losses[i]
        if not _finite(value):
            continue
        if value >= SUDDEN_JUMP * previous:
            return i
        previous = value
    return None


def _climbed_on(after: list[int], losses: list[float | None], rows: list[int]) -> bool:
    """After its jump (`after[0]`), the loss kept climbing: a jump of less than orders of
    magnitude (`FAR`x its previous row), then a rise on `RAMP_SHARE` of the rows or more, to a
    peak `SUDDEN_JUMP` times the value it jumped to or more, reached `SUDDEN_ROWS` rows on or
    later. The jump was the first step of a ramp (a learning rate too high from the start, the
    loss climbing row after row), not a blow-up that then sat where it landed or ran wild."""
    values = [v for i in after if _finite(v := losses[i])]
    before = _previous(losses, rows, after[0])
    if len(values) <= SUDDEN_ROWS or values[0] <= 0 or before is None or (
            values[0] >= FAR * before):
        return False
    peak_at = max(range(len(values)), key=lambda k: values[k])
    rises = sum(b > a for a, b in itertools.pairwise(values[:peak_at + 1]))
    return (peak_at >= SUDDEN_ROWS and values[peak_at] >= SUDDEN_JUMP * values[0]
            and rises >= RAMP_SHARE * peak_at)


def _shape(after: list[int], series: list[float | None], reference: float | None) -> str:
    """Sudden or gradual, in the signal that raised the alarm: sudden when it got halfway (in
    log space) from its level before to its peak within `SUDDEN_ROWS` rows."""
    if reference is None or reference <= 0:
        return EXPLOSION
    values = [(k, v) for k, i in enumerate(after) if _finite(v := series[i])]
    if not values:
        return SLOW
    peak = max(v for _, v in values)
    if peak <= reference:
        return EXPLOSION
    early = max(v for k, v in values if k < SUDDEN_ROWS) if values[0][0] < SUDDEN_ROWS \
        else reference
    halfway = math.log(peak / reference) / 2
    return EXPLOSION if math.log(early / reference) >= halfway else SLOW


def _recovering(after: list[int], losses: list[float | None]) -> bool:
    values = [v for i in after if _finite(v := losses[i])]
    if not values:
        return False
    peak_at = max(range(len(values)), key=lambda k: values[k])
    falling = values[peak_at:]
    return len(falling) > RECOVERING_ROWS and all(
        b < a for a, b in itertools.pairwise(falling))


def _ending_healthy(losses: list[float | None], rows: list[int]) -> str:
    values = [losses[i] for i in rows if _finite(losses[i])]
    if not values:
        return "no finite loss logged"
    return f"the loss went from {values[0]:.4g} to {values[-1]:.4g}"
