"""The HTML report of an analysed log (`trainguard analyze PATH --report out.html`).

The report of a run store (`trainguard.report`) draws what a guarded run recorded; a log holds
less, so the same page is built from what it has: the loss, gradient-norm and LR curves (NaN and
inf drawn as marks), the rows the optimizer skipped shaded, the offline detectors' events marked
on the curves, the verdict and the ranked causes. Per-parameter heat maps appear only where the
log holds per-parameter norms (a trainguard store).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trainguard.analyze.analysis import Analysis
from trainguard.analyze.log import GRAD_NORM, LOSS, LR
from trainguard.report.data import Matrix, RunData, Scalar

_VERDICT_LABELS = {"healthy": "healthy", "spike-recovered": "recovered", "diverged": "degraded",
                   "stalled": "stalled"}
"""The analysis verdicts on the report's colour scale (the live run verdict's labels)."""


def _scalar(values: list[float | None]) -> Scalar:
    missing = np.array([value is None for value in values], dtype=bool)
    array = np.array([np.nan if value is None else float(value) for value in values],
                     dtype=np.float64)
    return Scalar(array, missing)


def _grads(analysis: Analysis, steps: np.ndarray) -> Matrix:
    log = analysis.log
    assert log is not None
    matrix = log.param_grad_norms
    if matrix is None or not log.param_names:
        return Matrix(steps[:0], [], np.zeros((0, 0)), np.zeros((0, 0), dtype=bool))
    values = np.asarray(matrix, dtype=np.float64)
    return Matrix(steps, list(log.param_names), values, np.zeros(values.shape, dtype=bool))


def log_run_data(analysis: Analysis) -> RunData:
    """The report's view of an analysed log."""
    log = analysis.log
    assert log is not None, "an Analysis made by analyze() keeps its log"
    steps = np.array(log.steps, dtype=np.int64)
    skipped = log.skipped or [False] * len(log.steps)
    label = _VERDICT_LABELS.get(analysis.verdict, analysis.verdict)
    message = analysis.verdict + (f" ({analysis.kind})" if analysis.kind else "")
    if analysis.onset is not None:
        message += f" from {analysis.onset}"
    if analysis.evidence:
        message += ": " + analysis.evidence[0]
    meta: dict[str, Any] = {
        "verdict": {"verdict": label, "message": message,
                    "trouble_step": analysis.onset_step},
        "diagnosis": [cause.to_dict() for cause in analysis.causes],
        "preflight": None,
        "log_format": analysis.format,
    }
    notes = [f"analysed from a {analysis.format} log of {analysis.rows:,} rows, one every "
             f"{analysis.interval:g} {log.step_unit}s: per-step values between the rows are not "
             f"in it"]
    notes += [f"evidence: {line}" for line in analysis.evidence]
    notes += list(analysis.notes)
    return RunData(
        run_dir=str(Path(analysis.path)), run_id=1, run_ids=[1],
        info={"status": f"analysed ({analysis.verdict})"}, meta=meta, steps=steps,
        loss=_scalar(log.values(LOSS)), grad_norm=_scalar(log.values(GRAD_NORM)),
        clip_coef=_scalar([None] * len(log.steps)), lrs=[_scalar(log.values(LR))],
        step_actions=np.array(["skipped" if s else "applied" for s in skipped], dtype=object),
        events=list(analysis.events), actions=[], grads=_grads(analysis, steps), notes=notes)
