"""Suite-level figures: recall, false-alarm rate, latency; and the printed table."""

from __future__ import annotations

import math
import statistics
from typing import Any

from .base import Scenario
from .runner import RunResult


def totals(results: list[RunResult], scenarios: dict[str, Scenario],
           strategy: str = "trainguard") -> dict[str, Any]:
    mine = [r for r in results if r.strategy == strategy]
    faulty = [r for r in mine if not scenarios[r.scenario].healthy]
    healthy = [r for r in mine if scenarios[r.scenario].healthy]
    detected = [r for r in faulty if r.detected]
    sudden = [r.latency for r in detected
              if scenarios[r.scenario].sudden and r.latency is not None]
    latencies = [r.latency for r in detected if r.latency is not None]
    top1 = [r for r in faulty if r.diagnosis[:1] == [r.cause]]
    top3 = [r for r in faulty if r.cause in r.diagnosis[:3]]
    return {
        "top1": len(top1) / len(faulty) if faulty else math.nan,
        "top3": len(top3) / len(faulty) if faulty else math.nan,
        "top3_missed": [r.scenario for r in faulty if r.cause not in r.diagnosis[:3]],
        "strategy": strategy,
        "faulty": len(faulty),
        "healthy": len(healthy),
        "recall": len(detected) / len(faulty) if faulty else math.nan,
        "missed": [r.scenario for r in faulty if not r.detected],
        "healthy_with_events": [r.scenario for r in healthy if r.false_alarms],
        "healthy_judged_bad": [f"{r.scenario} ({r.verdict})" for r in healthy
                               if r.verdict in ("stalled", "degraded")],
        "verdicts": {v: sum(1 for r in mine if r.verdict == v)
                     for v in sorted({str(r.verdict) for r in mine if r.verdict is not None})},
        "false_alarm_rate": (sum(1 for r in healthy if r.false_alarms) / len(healthy)
                             if healthy else math.nan),
        "faulty_with_early_events": [r.scenario for r in faulty if r.false_alarms],
        "median_latency": statistics.median(latencies) if latencies else None,
        "max_latency": max(latencies) if latencies else None,
        "median_latency_sudden": statistics.median(sudden) if sudden else None,
        "max_latency_sudden": max(sudden) if sudden else None,
    }


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}g}"
    return str(value)


def table(results: list[RunResult], scenarios: dict[str, Scenario]) -> str:
    header = (f"{'scenario':<34}{'strategy':<15}{'cause':<19}{'onset':>6}{'outcome':>9}"
              f"{'detected':>9}{'latency':>8}{'false':>6}{'eval loss':>10}{'first event':>28}"
              f"  {'diagnosis (top 3)'}")
    lines = [header, "-" * len(header)]
    for r in results:
        first = next((e for e in r.events if e["step"] >= (r.onset_step or 0)), None)
        if scenarios[r.scenario].healthy and r.events:
            first = r.events[0]
        event = f"{first['kind']}@{first['step']}" if first else "-"
        detected = "-" if r.detected is None else ("yes" if r.detected else "NO")
        lines.append(f"{r.scenario:<34}{r.strategy:<15}{r.cause or 'healthy':<19}"
                     f"{_fmt(r.onset_step):>6}{r.outcome:>9}{detected:>9}{_fmt(r.latency):>8}"
                     f"{r.false_alarms:>6}{_fmt(r.final_eval_loss):>10}{event:>28}"
                     f"  {', '.join(r.diagnosis[:3]) or '-'}")
    return "\n".join(lines)


def summary_lines(summary: dict[str, Any]) -> str:
    return "\n".join([
        f"strategy {summary['strategy']}: {summary['faulty']} faulty, {summary['healthy']} healthy",
        f"  recall {_fmt(summary['recall'])}  missed: {', '.join(summary['missed']) or 'none'}",
        f"  false-alarm rate (healthy runs with a warning: an event or a preflight finding) "
        f"{_fmt(summary['false_alarm_rate'])}"
        f"  {', '.join(summary['healthy_with_events']) or ''}",
        f"  healthy runs judged stalled or degraded: "
        f"{', '.join(summary['healthy_judged_bad']) or 'none'}",
        f"  verdicts: {', '.join(f'{k} {v}' for k, v in summary['verdicts'].items()) or '-'}",
        f"  faulty runs with events before onset: "
        f"{', '.join(summary['faulty_with_early_events']) or 'none'}",
        f"  cause accuracy: top-1 {_fmt(summary['top1'])}, top-3 {_fmt(summary['top3'])}"
        f"  (top-3 misses: {', '.join(summary['top3_missed']) or 'none'})",
        f"  latency median {_fmt(summary['median_latency'])} max {_fmt(summary['max_latency'])}"
        f"  (sudden faults: median {_fmt(summary['median_latency_sudden'])}, max "
        f"{_fmt(summary['max_latency_sudden'])})",
    ])
