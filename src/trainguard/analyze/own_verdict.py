"""A trainguard store's own verdict, which `analyze` of the store states rather than contradicts.

A guarded run judges itself at its close (`trainguard.verdict`) from more than its store can
replay: the warnings of the probes' statistics (an `instability_precursor`, a collapsed output),
its own windows of steps, its weights at the close, a halt. `trainguard show` prints that
verdict, and `trainguard analyze` of the same directory says the same (both speak
`trainguard.vocabulary.Verdict`; a store written before they did may hold older words, mapped by
`vocabulary.verdict_named`), but for

    stalled     the replay's verdict: a run that never learned names no blow-up (the run's
                own verdict is told beside it)

Where the replay's verdict is another, the run's own takes its place and its message is the
ending. The replay's kind and onset stay where it found an incident; where it found none (the
trouble was in what the run measured live, not in the stored step signals), the onset is the
run's first trouble step, the incident the run's own events of warning severity or worse from
there on, and the kind is left unsaid.
"""

from __future__ import annotations

import bisect
import dataclasses
import math

from trainguard.analyze.judge import Judgement
from trainguard.analyze.log import Log
from trainguard.events import Event, at_least
from trainguard.vocabulary import DEGRADED, HEALTHY, RECOVERED, Verdict, verdict_named

ANALYZED: frozenset[Verdict] = frozenset({HEALTHY, RECOVERED, DEGRADED})
"""The verdicts the analysis of a log can reach too."""


def defer(judgement: Judgement, log: Log) -> Judgement:
    """The judgement of a log whose run left its own verdict, agreeing with it."""
    own = log.own_verdict
    if own is None:
        return judgement
    told = f"the run's own verdict at its close: {own['verdict']}: {own['message']}"
    verdict = verdict_named(own["verdict"])
    if verdict not in ANALYZED:
        return dataclasses.replace(judgement, ending="; ".join(
            part for part in (judgement.ending, told) if part))
    if verdict == judgement.verdict:
        return judgement
    if verdict == HEALTHY:
        read = (f"; the replay of its steps read trouble from {log.label(judgement.onset_row)}, "
                "which the run did not count" if judgement.onset_row is not None else "")
        return Judgement(HEALTHY, None, None, isolated=judgement.isolated, ending=told + read,
                         earlier=judgement.earlier)
    onset, incident = judgement.onset_row, judgement.incident
    if onset is None:
        onset = _row(log, own.get("trouble_step"))
        incident = [] if onset is None else [
            _at_row(e, row) for e in log.own_events
            if at_least(e.severity, "warning") and e.step >= log.steps[onset]
            and (row := _row(log, e.step)) is not None]
    return dataclasses.replace(
        judgement, verdict=verdict, onset_row=onset, incident=incident,
        reference=_level(own.get("before_trouble"), judgement.reference),
        final=_level(own.get("final"), judgement.final), ending=told)


def _row(log: Log, step: object) -> int | None:
    """The row of `step`: the last row at or before it (None: before the first row)."""
    if not isinstance(step, int):
        return None
    at = bisect.bisect_right(log.steps, step) - 1
    return at if at >= 0 else None


def _at_row(event: Event, row: int) -> Event:
    return dataclasses.replace(event, details={**event.details, "row": row})


def _level(value: object, fallback: float | None) -> float | None:
    return value if isinstance(value, float) and math.isfinite(value) else fallback
