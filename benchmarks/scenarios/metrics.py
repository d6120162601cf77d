"""Suite-level figures: recall, false-alarm rate, latency; and the printed table."""

from __future__ import annotations

import math
import statistics
from typing import Any

from trainguard.diagnose.counterfactual import TESTED_CAUSES

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
    voted1 = [r for r in faulty if r.voted_diagnosis[:1] == [r.cause]]
    top3 = [r for r in faulty if r.cause in r.diagnosis[:3]]
    return {
        "top1": len(top1) / len(faulty) if faulty else math.nan,
        "top3": len(top3) / len(faulty) if faulty else math.nan,
        "top3_missed": [r.scenario for r in faulty if r.cause not in r.diagnosis[:3]],
        "top1_voted": len(voted1) / len(faulty) if faulty else math.nan,
        "top1_missed": [r.scenario for r in faulty if r.diagnosis[:1] != [r.cause]],
        **proof_totals(faulty, healthy),
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


def _proofs(result: RunResult) -> list[dict[str, Any]]:
    return [e["details"] for e in result.events if e["kind"] == "proof"]


def proof_totals(faulty: list[RunResult], healthy: list[RunResult]) -> dict[str, Any]:
    """What the replays of bad steps proved: the faults whose cause an intervention tests
    (`TESTED_CAUSES`), those whose true cause a reproduced replay confirmed (and of the others,
    those never replayed: no step raised what a proof runs on), the causes confirmed
    wrongly, the faults never reproduced (and those whose step replayed as it ran but was not bad
    on its own: damage built up earlier), and healthy runs with anything confirmed."""
    applicable = [r for r in faulty if r.cause in TESTED_CAUSES]
    confirmed = [r for r in applicable
                 if any(r.cause in p.get("confirmed", {}) for p in _proofs(r))]
    proved = [r for r in faulty if _proofs(r)]
    seconds = [p["seconds"] for r in faulty for p in _proofs(r)]
    return {
        "proof_applicable": len(applicable),
        "proof_confirmed": len(confirmed),
        "proof_unconfirmed": [r.scenario for r in applicable if r not in confirmed],
        "proof_never_replayed": [r.scenario for r in applicable
                                 if r not in confirmed and not _proofs(r)],
        "proof_runs": len(proved),
        "proof_not_reproducible": [r.scenario for r in proved
                                   if not any(p.get("reproduced") or p.get("faithful")
                                              for p in _proofs(r))],
        "proof_older_damage": [r.scenario for r in proved
                               if not any(p.get("reproduced") for p in _proofs(r))
                               and any(p.get("faithful") for p in _proofs(r))],
        "proof_wrong": [f"{r.scenario} ({', '.join(sorted(set(c)))})" for r in faulty
                        if (c := [code for p in _proofs(r) for code in _wrong(p, r.cause)])],
        # the healthy step each healthy run proves on demand (not an incident): nothing to heal
        "proof_healthy_confirmed": [r.scenario for r in healthy
                                    if any(p.get("confirmed") for p in _proofs(r)
                                           if not p.get("incident", True))],
        "proof_healthy_checked": sum(1 for r in healthy
                                     if any(not p.get("incident", True) for p in _proofs(r))),
        # a false alarm's step proved as an incident: what its replay confirmed
        "proof_healthy_incidents": [
            f"{r.scenario} ({', '.join(sorted({c for p in _proofs(r) for c in p['confirmed']}))})"
            for r in healthy if any(p.get("confirmed") for p in _proofs(r)
                                    if p.get("incident", True))],
        "proof_seconds_median": statistics.median(seconds) if seconds else None,
        "proof_seconds_max": max(seconds) if seconds else None,
    }


def _wrong(proof: dict[str, Any], cause: str | None) -> list[str]:
    """The causes a proof confirmed that are not the true one, leaving out those confirmed by the
    intervention that confirmed the true one (a healed batch confirms the data: every data cause
    it can hold, the true one among them)."""
    by = proof.get("confirmed_by") or {}
    with_true = by.get(cause) if cause in proof.get("confirmed", {}) else None
    return [code for code in proof.get("confirmed", {})
            if code != cause and (with_true is None or by.get(code) != with_true)]


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
        f"  top-1 by votes alone {_fmt(summary['top1_voted'])}; top-1 misses: "
        f"{', '.join(summary['top1_missed']) or 'none'}",
        *_proof_lines(summary),
        f"  latency median {_fmt(summary['median_latency'])} max {_fmt(summary['max_latency'])}"
        f"  (sudden faults: median {_fmt(summary['median_latency_sudden'])}, max "
        f"{_fmt(summary['max_latency_sudden'])})",
    ])


def _proof_lines(summary: dict[str, Any]) -> list[str]:
    if not summary["proof_runs"] and not summary["proof_healthy_checked"]:
        return ["  proofs: none ran (--prove on, or --policy halt/recover)"]
    return [
        f"  proofs: true cause confirmed by replay in {summary['proof_confirmed']}/"
        f"{summary['proof_applicable']} faults an intervention tests (unconfirmed: "
        f"{', '.join(summary['proof_unconfirmed']) or 'none'}; of them never replayed: no "
        f"incident to prove, or no good state within the budget's reach: "
        f"{', '.join(summary.get('proof_never_replayed', [])) or 'none'}); "
        f"{summary['proof_runs']} faulty "
        f"runs proved, not reproducible: {', '.join(summary['proof_not_reproducible']) or 'none'}"
        f"; replayed as they ran, not bad on their own (older damage): "
        f"{', '.join(summary.get('proof_older_damage', [])) or 'none'}",
        f"  proofs: other causes confirmed: {', '.join(summary['proof_wrong']) or 'none'}; "
        f"healthy runs checked at a healthy step {summary['proof_healthy_checked']}, with a cause "
        f"confirmed: {', '.join(summary['proof_healthy_confirmed']) or 'none'}; a false alarm "
        f"proved, with its confirmed causes: "
        f"{', '.join(summary.get('proof_healthy_incidents', [])) or 'none'}; seconds per proof "
        f"median {_fmt(summary['proof_seconds_median'])} max {_fmt(summary['proof_seconds_max'])}",
    ]
