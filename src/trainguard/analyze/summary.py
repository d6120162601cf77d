"""What `trainguard analyze` prints: a short summary per log, a table for several, JSON."""

from __future__ import annotations

import math

from trainguard.analyze.analysis import Analysis
from trainguard.analyze.log import GRAD_NORM, LOSS, LR
from trainguard.formatting import sparkline
from trainguard.vocabulary import HEALTHY

MAX_EVIDENCE = 8
MAX_CAUSES = 3


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}"


def headline(result: Analysis) -> str:
    if result.verdict == HEALTHY:
        return "healthy: no trouble in the logged values"
    what = result.verdict.upper()
    kind = f" ({result.kind})" if result.kind else ""
    return f"{what}{kind} from {result.onset}"


def _every(interval: float, unit: str) -> str:
    """How often the log was written, in its own counter's unit (`every epoch`, `every 10 iters`,
    `every 50 (num_updates)`)."""
    if interval == 1:
        return f"every {unit}"
    if not unit.replace(" ", "").isalpha():
        return f"every {interval:g} ({unit})"
    return f"every {interval:g} {unit}{'es' if unit.endswith(('tch', 'sh', 's', 'x')) else 's'}"


def summary_lines(result: Analysis) -> list[str]:
    """The human summary of one log."""
    every = _every(result.interval, result.log.step_unit if result.log is not None else "step")
    lines = [f"log        {result.path} ({result.format}, {result.rows} rows, {every})",
             f"verdict    {headline(result)}"]
    for name, label in ((LOSS, "loss"), (GRAD_NORM, "grad norm")):
        values = result.curve(name) if result.log is not None and result.log.has(name) else []
        if values:
            finite = [v for v in values if math.isfinite(v)]
            span = (f"  {_fmt(finite[0])} -> {_fmt(finite[-1])}" if finite else "  all non-finite")
            lines.append(f"{label:<10} {sparkline(values)}{span}")
    if result.log is not None and result.log.has(LR):
        lrs = [v for v in result.curve(LR) if math.isfinite(v)]
        if lrs:
            lines.append(f"{'lr':<10} first {_fmt(lrs[0])}  peak {_fmt(max(lrs))}  "
                         f"last {_fmt(lrs[-1])}")
    if result.evidence:
        lines.append("evidence")
        for line in result.evidence[:MAX_EVIDENCE]:
            lines.append(f"  - {line}")
        if len(result.evidence) > MAX_EVIDENCE:
            lines.append(f"  ... {len(result.evidence) - MAX_EVIDENCE} more (--json lists all)")
    if result.causes:
        lines.append("likely causes")
        for cause in result.causes[:MAX_CAUSES]:
            lines.append(f"  {cause.code:<18} {cause.confidence:>4.0%}  "
                         f"{'; '.join(cause.evidence[:2])}")
            lines.append(f"  {'':<18}       fix: {cause.fix}")
    for note in result.notes:
        lines.append(f"note       {note}")
    return lines


def table_lines(results: list[Analysis | tuple[str, str]]) -> list[str]:
    """One row per log: an Analysis, or (path, error message) for one that could not be read."""
    rows: list[tuple[str, ...]] = []
    for result in results:
        if isinstance(result, tuple):
            rows.append((result[0], "-", "-", "error", "-", "-", result[1]))
            continue
        rows.append((result.path, result.format, str(result.rows), result.verdict,
                     result.kind or "-", result.onset or "-",
                     result.causes[0].code if result.causes else "-"))
    header = ("path", "format", "rows", "verdict", "kind", "onset", "likely cause")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
            for row in [header, *rows]]
