"""`analyze(path)`: read a training log, replay the detectors over it, judge it, rank causes.

    log = read_log(path)              # the reader of its format (formats.py)
    log = prepare(log)                # NaN-filtered windows, skipped steps (quirks.py)
    config = scaled_config(...)       # the detectors' windows in rows (sparse.py)
    events = replay(log, config)      # the live detector classes, row by row (offline.py)
    judgement = judge(...)            # verdict, kind, onset (judge.py)
    judgement = defer(judgement, log) # a store's own verdict, where it holds one (own_verdict.py)
    causes = rank_causes(...)         # the cause ranking of live runs, on what the log holds
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.analyze import (
    adversarial,
    periodic,
    resolution,
    rl_log,
    runs,
    scores,
    stall,
    text,
)
from trainguard.analyze import chance as chance_level
from trainguard.analyze.findings import log_findings
from trainguard.analyze.formats import read_log
from trainguard.analyze.judge import (
    EXPLOSION,
    SLOW,
    Judgement,
    judge,
)
from trainguard.analyze.log import LOSS, Log
from trainguard.analyze.lossless import (
    evaluation_went_nonfinite,
    metric_went_nonfinite,
    went_nonfinite,
)
from trainguard.analyze.offline import replay
from trainguard.analyze.own_verdict import defer
from trainguard.analyze.quirks import prepare
from trainguard.analyze.sparse import scaled_config
from trainguard.chance_level import chance_loss
from trainguard.config import DetectorConfig
from trainguard.diagnose.ranking import rank_causes
from trainguard.events import Event
from trainguard.finding import Finding
from trainguard.ranked_cause import RankedCause
from trainguard.registry import Kind
from trainguard.vocabulary import DEGRADED, HEALTHY, RECOVERED, STALLED, Verdict


@dataclass(slots=True)
class Analysis:
    path: str
    format: str
    verdict: Verdict
    """`healthy`, `recovered`, `degraded` or `stalled` (`trainguard.vocabulary.Verdict`: the live
    verdict's words; `stalled` when the log shows a run that learned nothing)."""
    kind: str | None
    """`nan`, `explosion`, `slow-divergence` or `collapse` (None when healthy)."""
    onset_step: int | None
    """The first logged step at which the numbers are off, in the log's own step units."""
    onset: str | None
    """The same row as the log names it ("epoch 4, batch 1400")."""
    evidence: list[str]
    causes: list[RankedCause]
    events: list[Event] = field(default_factory=list)
    """Every event the detectors raised over the log."""
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rows: int = 0
    interval: float = 1.0
    log: Log | None = field(default=None, repr=False)
    judgement: Judgement | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "kind": self.kind, "onset_step": self.onset_step,
                "evidence": list(self.evidence), "causes": [c.to_dict() for c in self.causes],
                "path": self.path, "format": self.format, "onset": self.onset,
                "rows": self.rows, "interval": self.interval, "notes": list(self.notes)}

    def curve(self, name: str = LOSS) -> list[float]:
        """A logged series with missing rows left out (for plots)."""
        assert self.log is not None
        return [v for v in self.log.values(name) if v is not None]


def analyze(path: str | Path, *, fmt: str | None = None, num_classes: int | None = None,
            run_id: str | None = None) -> Analysis:
    """Analyse one training log (any format of `trainguard.analyze.FORMATS`); `run_id` picks a
    run of a W&B folder or an MLflow store."""
    return analyze_log(read_log(path, fmt, run_id), num_classes=num_classes)


def analyze_log(raw: Log, *, num_classes: int | None = None) -> Analysis:
    """The analysis of a log read already; a log of several runs that is not healthy read as
    one is judged run by run (`analyze/runs.py`)."""
    whole = _analyze_one(raw, num_classes)
    if whole.verdict == HEALTHY or not (starts := runs.run_starts(raw)):
        return whole
    bounds = list(zip([0, *starts], [*starts, len(raw)], strict=True))
    where = ", ".join(raw.label(row) for row in starts)
    for number, (start, end) in enumerate(bounds, 1):
        part = _analyze_one(runs.run_of(raw, start, end), num_classes)
        if part.verdict != HEALTHY:
            note = (f"the log holds {len(bounds)} runs (its counter starts again at {where}), "
                    f"judged one by one: this is run {number} ({raw.label(start)} to "
                    f"{raw.label(end - 1)}), the first that is not healthy")
            return dataclasses.replace(part, notes=[*whole.notes, note])
    why = (f"the log holds {len(bounds)} runs (its counter starts again at {where}); each, "
           "judged from its own start, is healthy: the rise at each new start is a fresh "
           "model's first losses")
    return dataclasses.replace(
        whole, verdict=HEALTHY, kind=None, onset_step=None, onset=None, evidence=[why],
        causes=[], findings=[], judgement=Judgement(HEALTHY, None, None, ending=why))


def _analyze_one(raw: Log, num_classes: int | None) -> Analysis:
    log = prepare(adversarial.set_aside_game(rl_log.set_aside_surrogate(raw)))
    config = _config(log)
    replayed = replay(log, config, num_classes=num_classes)
    events = replayed.events
    losses = log.values(LOSS)
    at_chance = chance_level.back_to_chance(losses, num_classes,
                                            guess=chance_level.is_classifier(log))
    extra = (_above_chance(log) + went_nonfinite(log) + metric_went_nonfinite(log)
             + evaluation_went_nonfinite(log))
    rounding = _within_rounding(log, events)
    judged = [e for e in events + extra if e not in rounding]
    # without a loss, every row holds what the log says of the run (`analyze/lossless.py`)
    rows = replayed.rows if log.has(LOSS) else list(range(len(log)))
    judgement = defer(judge(log, rows, judged, config, at_chance), log)
    judgement = _periodic(judgement, log)
    if judgement.verdict == HEALTHY and (why := stall.learns_nothing(raw)) is not None:
        judgement = Judgement(STALLED, None, rows[0] if rows else 0, ending=why)
    elif judgement.verdict == HEALTHY and (zero := (stall.went_to_zero(raw)
                                                   or stall.went_frozen(raw)
                                                   or adversarial.discriminator_won(raw))
                                           ) is not None:
        judgement = Judgement(STALLED, None, zero[0], ending=zero[1])
    by_scores = not raw.has(LOSS) and (judgement.verdict == HEALTHY
                                       or _evaluations_alone(judgement))
    scored = scores.judge_scores(log) if by_scores else None
    if scored is not None:
        judgement = scored  # no loss: its quality metrics say what the run did
    elif by_scores and judgement.verdict != HEALTHY:  # a cliff of its evaluations alone
        judgement = Judgement(HEALTHY, None, None, isolated=judgement.isolated,
                              ending="no finite loss logged; the evaluations fell off no level "
                                     "they held")
    judgement = _untrained_to_the_end(judgement, log, replayed.untrained)
    if rl_log.set_aside(log) or (not log.has(LOSS) and rl_log.reward_column(log)):
        judgement = _rl_progress(judgement, log)
    elif judgement.verdict == HEALTHY and (game := adversarial.progress(log)) is not None:
        judgement = dataclasses.replace(judgement, ending=game)
    # a run that learned nothing had no incident, unless a detector told it: no trouble step
    # to read the log's findings around
    troubled = judgement.verdict not in (HEALTHY, STALLED)
    findings = log_findings(log, judgement) if troubled else []
    # a stall a detector told (a dead reward, an unlearned preference) says why in its events
    # (a metric's cliff alone, with no training value beside it, tells no cause from another)
    causes = (rank_causes(_ranked_events(judgement, events), findings, batches=False)
              if (troubled or judgement.incident) and scored is None else [])
    for cause in causes:
        cause.evidence = [_in_log_terms(log, line) for line in cause.evidence]
    onset_row = judgement.onset_row
    return Analysis(
        path=raw.path, format=raw.format, verdict=judgement.verdict, kind=judgement.kind,
        onset_step=log.steps[onset_row] if onset_row is not None else None,
        onset=log.label(onset_row) if onset_row is not None else None,
        evidence=_evidence(log, judgement, findings), causes=causes, events=events + extra,
        findings=findings,
        notes=list(log.notes) + _rounding_notes(log, rounding) + _nonfinite_notes(log, judged),
        rows=len(log), interval=log.interval(),
        log=log, judgement=judgement)


_STEP = re.compile(r"\bstep (\d+)\b")


def _in_log_terms(log: Log, text: str) -> str:
    """`step N` in a cause's evidence as the log names that row (`row 5 (epoch 0.2)`,
    `iteration 7010`): the ranking speaks of steps, a log of its own rows."""
    if log.step_unit == "step" and log.labels is None:
        return text
    rows = {step: row for row, step in enumerate(log.steps)}

    def name(match: re.Match[str]) -> str:
        row = rows.get(int(match.group(1)))
        return log.label(row) if row is not None else match.group(0)

    return _STEP.sub(name, text)


def _evaluations_alone(judgement: Judgement) -> bool:
    """Whether only the evaluations' cliffs made the trouble, each of a metric
    `analyze/scores.py` judges (in a log with no loss, whose LR rows are no level to judge a
    fall from; a NaN, an accuracy back at the chance the user named, a reward's fall stay the
    evaluations' own verdict)."""
    return bool(judgement.incident) and all(
        e.kind == Kind.METRIC_COLLAPSE and e.details.get("rule") == "cliff"
        and scores.judges(str(e.details.get("metric", ""))) for e in judgement.incident)


def _ranked_events(judgement: Judgement, events: list[Event]) -> list[Event]:
    """What the ranking weighs: the incident's events and the LR changes before it. An
    evaluation that collapsed because the training itself blew up (or went NaN) is a
    consequence, not the labels' doing, and is left out (it stays in the evidence)."""
    incident = judgement.incident
    if any(e.kind != Kind.METRIC_COLLAPSE for e in incident):
        incident = [e for e in incident if e.kind != Kind.METRIC_COLLAPSE]
    changes = [e for e in events if e.kind == Kind.LR_CHANGE]
    return changes + incident


def _untrained_to_the_end(judgement: Judgement, log: Log,
                          untrained: tuple[int, str, str] | None) -> Judgement:
    """A run whose logged rows learned nothing from some row to the end (a detector's streak,
    `Detector.untrained`: the reward signal dead, a policy that never left its reference) is
    stalled, as the live verdict says it, unless the log shows other trouble (degraded by
    another event stays degraded)."""
    if untrained is None or judgement.verdict == STALLED:
        return judgement
    row, kind, what = untrained
    if judgement.verdict == DEGRADED and any(e.kind != kind for e in judgement.incident):
        return judgement
    ending = f"{what} from {log.label(row)} to the end of the log: nothing trained after it"
    return Judgement(STALLED, None, row, incident=judgement.incident, ending=ending,
                     isolated=judgement.isolated)


def _rl_progress(judgement: Judgement, log: Log) -> Judgement:
    """An RL run whose loss was set aside (`analyze/rl_log.py`) summed up by its reward and KL:
    healthy, what they did; in trouble with no loss level to come back to, what they did
    from the first row to the last, the loss's level unjudged."""
    said = rl_log.progress(log)
    if said is None or judgement.verdict not in (HEALTHY, DEGRADED):
        return judgement
    if judgement.verdict == DEGRADED:
        onset = judgement.onset_row
        surrogate_nan = (judgement.kind == "nan" and onset is not None
                         and all(e.kind == "nonfinite_loss" for e in judgement.incident))
        unborn = rl_log.before_first_update(log) if surrogate_nan else None
        if unborn is not None:  # no update had been made: nothing went wrong
            return Judgement(HEALTHY, None, None, isolated=judgement.isolated,
                             ending=f"{said}; {unborn}")
        back = rl_log.came_back(log, onset) if surrogate_nan and onset is not None else None
        if back is not None:  # a NaN the run stepped over, told by what the log holds
            return dataclasses.replace(judgement, verdict=RECOVERED, ending=back)
        held = (rl_log.kl_came_back(log, onset) if onset is not None and judgement.incident
                and all(e.kind == Kind.KL_BLOWUP for e in judgement.incident) else None)
        if held is not None and onset is not None:  # the KL is a diagnostic: the reward
            return Judgement(HEALTHY, None, None,  # says what the run learned
                             isolated=judgement.isolated + judgement.incident,
                             ending=f"{said}; the KL jumped at {log.label(onset)} and {held}: "
                                    "a note, not a verdict")
        if judgement.reference is not None or judgement.kind == "nan":
            return judgement
        said = (f"{said}; the log holds no loss level to come back to (its loss is the RL "
                "trainer's own objective, not judged)")
    return dataclasses.replace(judgement, ending=said)


def _periodic(judgement: Judgement, log: Log) -> Judgement:
    """A finite rise in a loss that rises and falls with a period (`analyze/periodic.py`), no
    higher than its earlier teeth: the log's structure, healthy with a note."""
    if (judgement.verdict not in (RECOVERED, DEGRADED) or judgement.kind not in (EXPLOSION, SLOW)
            or judgement.onset_row is None or any(e.kind == Kind.LOSS_AT_CHANCE
                                                  for e in judgement.incident)):
        return judgement
    losses = log.values(LOSS)
    found = periodic.period(losses)
    if found is None or not periodic.within_teeth(losses, judgement.onset_row):
        return judgement
    rows, correlation = found
    ending = (f"{judgement.ending}; but the loss rises and falls every {rows} rows "
              f"(autocorrelation {correlation:.2f} one period apart, trend removed), and from "
              f"{log.label(judgement.onset_row)} it went no higher than its earlier teeth: "
              "periodic structure (batches grouped by length, data order, restarts), not "
              "divergence")
    return Judgement(HEALTHY, None, None, isolated=judgement.isolated, ending=ending)


def _within_rounding(log: Log, events: list[Event]) -> list[Event]:
    """Rises of the loss too small to read at the precision the log writes it
    (`analyze/resolution.py`): 0.0001 to 0.0003 is a 3x ratio and two units of rounding."""
    unit = None
    found = []
    for event in events:
        if event.kind not in (Kind.LOSS_SPIKE, Kind.LOSS_DIVERGENCE):
            continue
        level = event.details.get("baseline", event.details.get("best"))
        value = event.value
        if not isinstance(level, (int, float)) or value is None or not math.isfinite(value):
            continue
        if unit is None:
            unit = resolution.quantum(log.values(LOSS))
            if unit is None:
                return []
        if resolution.below_resolution(value - level, unit):
            found.append(event)
    return found


def _nonfinite_notes(log: Log, told: list[Event]) -> list[str]:
    """The NaN and inf of each value other than the loss that no event told (nothing hides a
    NaN: a value that comes back to a number, or of a name no rule reads, is counted here)."""
    named = {event.param for event in told}
    notes = []
    for name in log.series:
        if name == LOSS or name in named:
            continue
        rows, values = log.series.points(name)
        bad = [row for row, value in zip(rows, values, strict=True) if not math.isfinite(value)]
        if bad:
            notes.append(f"{name}: {len(bad)} non-finite value(s) of {len(values)}, the first "
                         f"at {log.label(bad[0])}")
    return notes


def _rounding_notes(log: Log, rounding: list[Event]) -> list[str]:
    if not rounding:
        return []
    first = rounding[0]
    return [f"{log.label(first.details['row'])}: {first.kind} not counted: the loss rose to "
            f"{first.value or 0:.4g}, fewer than {resolution.UNITS} units of the last digit the "
            f"log writes it to ({len(rounding)} such event(s)): rounding, not a jump"]


def _config(log: Log) -> DetectorConfig:
    if log.detector_config is not None and log.interval() <= 1:
        try:
            return DetectorConfig.from_dict(log.detector_config)
        except (TypeError, ValueError):
            pass  # thresholds of another trainguard version: the defaults, scaled
    # an excerpt of rows that are means is judged from its first row as a log from the start
    # is: one mean of many steps (`text.MEANS`, an epoch's row) is a level to jump from
    means = (log.format.startswith("text:") and log.format.split(":", 1)[1] in text.MEANS) \
        or log.step_unit == "epoch"
    return scaled_config(len(log), log.interval(), from_start=log.starts_at_start() or means,
                         means=not log.single_batch)


def _above_chance(log: Log) -> list[Event]:
    """A cross-entropy worse than any uniform guess from the first row (the log reports its
    perplexity, so the loss is one), a loss term saturated at float32's floor, or a
    classification loss the log names that is so on every row (`analyze/chance.py`)."""
    most = chance_level.MAX_CLASSES
    ceiling = f"ln {most} = {chance_loss(most):.3g}"
    if any("ppl" in name.lower() or "perplexity" in name.lower() for name in log.series):
        row = chance_level.above_any_chance(log.values(LOSS))
        if row is not None:
            value = log.values(LOSS)[row]
            return [Event(kind="loss_above_chance", step=log.steps[row], severity="error",
                          message=f"the first logged loss, {value:.4g}, is above {ceiling}, "
                                  "worse than a uniform guess over any vocabulary: the weights "
                                  "blew up before the first logged step",
                          value=value, details={"row": row})]
    found = chance_level.saturated(log)
    if found is not None:
        row, name = found
        return [Event(kind="loss_above_chance", step=log.steps[row], severity="error",
                      message=f"{name} sits at {chance_level.SATURATED:.6g} = -ln(float32's "
                              "smallest normal number): the softmax's probability of the true "
                              "class underflowed (Caffe's SoftmaxWithLoss stops there), the "
                              "logits blew up",
                      param=name, value=chance_level.SATURATED, details={"row": row})]
    for name in log.series:
        if not chance_level.is_classification_loss(name):
            continue
        rows, values = log.series.points(name)
        if not chance_level.always_above_any_chance(values):
            continue
        return [Event(kind="loss_above_chance", step=log.steps[rows[0]], severity="error",
                      message=f"{name}, a classification loss, is above {ceiling} on every "
                              f"logged row ({values[0]:.4g} to {values[-1]:.4g}): worse than a "
                              "uniform guess over any number of classes from the first logged "
                              "step to the last, the weights blew up before it",
                      param=name, value=values[0], details={"row": rows[0]})]
    return []


def _evidence(log: Log, judgement: Judgement, findings: list[Finding]) -> list[str]:
    lines: list[str] = []
    seen: set[str] = set()
    for event in judgement.incident:
        if event.kind in seen:
            continue
        seen.add(event.kind)
        lines.append(f"{log.label(event.details['row'])}: {event.kind}: {event.message}")
        if len(seen) >= 4:
            break
    shown = {line.split(":", 1)[0] for line in lines}
    jumps = sorted({e.details["row"] for e in judgement.incident
                    if e.kind in (Kind.LOSS_SPIKE, Kind.GRAD_EXPLOSION)})
    starts = [row for k, row in enumerate(jumps) if k == 0 or row - jumps[k - 1] > 1]
    again = [label for row in starts if (label := log.label(row)) not in shown]
    if again:  # the onset is the first incident of its kind: the later ones, listed
        lines.append(f"again at {', '.join(again[:6])}"
                     + (f" and {len(again) - 6} more" if len(again) > 6 else ""))
    if judgement.ending and judgement.verdict != HEALTHY:
        lines.append(judgement.ending)
    for event in judgement.earlier[:2]:
        lines.append(f"{log.label(event.details['row'])}: earlier, and the run came back from "
                     f"it: {event.kind}: {event.message}")
    for finding in findings:
        lines.append(finding.message)
    for event in judgement.isolated[:3]:
        why = ("the log ends on it: nothing after it says whether it lasted" if
               event.details["row"] == len(log) - 1 else "back to normal at the next row")
        lines.append(f"{log.label(event.details['row'])}: isolated {event.kind} ({why}, not "
                     f"counted): {event.message}")
    if len(judgement.isolated) > 3:
        lines.append(f"... {len(judgement.isolated) - 3} more isolated jumps")
    if judgement.verdict == HEALTHY:
        lines.insert(0, judgement.ending)
    return lines
