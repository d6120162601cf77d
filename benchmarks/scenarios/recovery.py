"""The recovery benchmark: does a strategy bring a recoverable fault back to healthy quality?

Every faulty scenario is measured against the healthy scenario of the same model and precision
(each family's explicit `BASELINES`): the reference is that healthy run's final held-out loss under
no protection. A run *recovers* when it finishes and ends within `WITHIN` (5%) of the
reference; a loss below the reference counts as within. Healthy scenarios are measured against
their own unprotected run, to show whether a strategy makes a healthy fine-tune worse: by more than
`HEALTHY_TOLERANCE` (1%), or by not finishing. Runs are deterministic for a given seed and thread
count, so repeating a run gives the same loss; 1% is a margin for the small shifts any change of
the update sequence causes (`docs/benchmarks.md` gives the seed-to-seed spread for comparison).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from .base import Scenario
from .runner import RunResult
from .strategies import RECOVERY_STRATEGIES

REFERENCE_STRATEGY = "none"
"""The strategy whose healthy runs are the references."""
WITHIN = 0.05
"""A fault is recovered when the run finishes at most this much above its baseline's loss."""
HEALTHY_TOLERANCE = 0.01
"""A healthy run is made worse when its loss ends more than this much above the unprotected
run of the same scenario (or it does not finish)."""
TARGET_SHARE = 0.9
"""The `recover` strategy's target: this share of the recoverable faults recovered."""


def baselines() -> dict[str, str]:
    """Faulty scenario name -> the healthy scenario it is measured against, from every family."""
    from .families import FAMILIES

    mapping: dict[str, str] = {}
    for module in FAMILIES:
        mapping.update(getattr(module, "BASELINES", {}))
    return mapping


def baseline_of(scenario: Scenario, mapping: dict[str, str] | None = None) -> str:
    """The healthy scenario `scenario` is measured against (a healthy one is its own)."""
    if scenario.healthy:
        return scenario.name
    mapping = baselines() if mapping is None else mapping
    if scenario.name not in mapping:
        raise KeyError(f"faulty scenario {scenario.name!r} has no healthy baseline: add it to "
                       f"the BASELINES of its family module ({scenario.family})")
    return mapping[scenario.name]


def recovery_scenarios(selected: list[Scenario], catalogue: list[Scenario]) -> list[Scenario]:
    """The recoverable faulty and the healthy scenarios among `selected`, plus the baselines of
    the faulty ones that the selection left out (their references are needed)."""
    by_name = {s.name: s for s in catalogue}
    chosen = [s for s in selected if s.healthy or s.recoverable]
    names = {s.name for s in chosen}
    mapping = baselines()
    for s in list(chosen):
        base = baseline_of(s, mapping)
        if base not in names:
            chosen.append(by_name[base])
            names.add(base)
    return chosen


@dataclass
class RecoveryRow:
    scenario: str
    strategy: str
    cause: str | None
    """None for a healthy scenario."""
    baseline: str
    outcome: str
    eval_loss: float
    reference: float
    """The baseline's final eval loss under `REFERENCE_STRATEGY` (NaN when it did not run or
    did not end finite)."""
    ratio: float
    """eval_loss / reference; NaN when either is not finite."""
    within: bool
    """Finished and ratio <= 1 + WITHIN."""
    worse: bool
    """Did not finish, or ratio > 1 + HEALTHY_TOLERANCE (meaningful for healthy scenarios)."""
    rolled_back_steps: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ratio(loss: float, reference: float) -> float:
    if not (math.isfinite(loss) and math.isfinite(reference) and reference > 0):
        return math.nan
    return loss / reference


def recovery_rows(results: list[RunResult], scenarios: dict[str, Scenario]) -> list[RecoveryRow]:
    """One row per result, scored against its baseline's unprotected run among `results`."""
    mapping = baselines()
    reference = {r.scenario: r.final_eval_loss for r in results
                 if r.strategy == REFERENCE_STRATEGY and r.outcome == "finished"}
    rows = []
    for r in results:
        base = baseline_of(scenarios[r.scenario], mapping)
        ref = reference.get(base, math.nan)
        ratio = _ratio(r.final_eval_loss, ref)
        finished = r.outcome == "finished"
        # written so that a NaN ratio takes the failing branch
        within = finished and ratio <= 1 + WITHIN
        worse = not (finished and ratio <= 1 + HEALTHY_TOLERANCE)
        rows.append(RecoveryRow(
            scenario=r.scenario, strategy=r.strategy, cause=r.cause, baseline=base,
            outcome=r.outcome, eval_loss=r.final_eval_loss, reference=ref, ratio=ratio,
            within=within, worse=worse, rolled_back_steps=r.rolled_back_steps))
    return rows


def recovery_totals(rows: list[RecoveryRow]) -> dict[str, Any]:
    """Per strategy: the share of recoverable faults recovered, the healthy scenarios made worse
    and the rolled-back steps; and whether `recover` meets its target."""
    strategies = list(dict.fromkeys(r.strategy for r in rows))
    per: dict[str, Any] = {}
    for strategy in strategies:
        faults = [r for r in rows if r.strategy == strategy and r.cause is not None]
        healthy = [r for r in rows if r.strategy == strategy and r.cause is None]
        recovered = [r for r in faults if r.within]
        per[strategy] = {
            "faults": len(faults),
            "recovered": len(recovered),
            "share": len(recovered) / len(faults) if faults else math.nan,
            "missed": [r.scenario for r in faults if not r.within],
            "healthy": len(healthy),
            "healthy_worse": {r.scenario: r.ratio for r in healthy if r.worse},
            "rolled_back_steps_faults": sum(r.rolled_back_steps for r in faults),
            "rolled_back_steps_healthy": sum(r.rolled_back_steps for r in healthy),
        }
    totals: dict[str, Any] = {"within": WITHIN, "healthy_tolerance": HEALTHY_TOLERANCE,
                              "reference_strategy": REFERENCE_STRATEGY, "strategies": per}
    mine = per.get("recover")
    if mine is not None:
        # its deferred twin is the same policy, not another way to take a step
        others = [v["share"] for k, v in per.items() if k not in ("recover", "recover_deferred")]
        share = mine["share"]
        ahead = all(share > other or math.isnan(other) for other in others)
        totals["target"] = {
            "share_at_least": TARGET_SHARE,
            "share_met": share >= TARGET_SHARE,  # NaN (no faults) fails
            "ahead_of_every_other": ahead,
            "no_healthy_worse": not mine["healthy_worse"],
        }
        totals["target"]["met"] = all(totals["target"][k] for k in (
            "share_met", "ahead_of_every_other", "no_healthy_worse"))
    return totals


def _fmt(value: float, digits: int = 4) -> str:
    return "nan" if math.isnan(value) else f"{value:.{digits}g}"


def _fmt3(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:.3f}"


def recovery_table(rows: list[RecoveryRow]) -> str:
    header = (f"{'scenario':<34}{'strategy':<15}{'cause':<19}{'baseline':<27}{'outcome':>9}"
              f"{'eval loss':>10}{'reference':>10}{'ratio':>8}{'within 5%':>10}"
              f"{'rolled back':>12}")
    lines = [header, "-" * len(header)]
    for r in rows:
        within = "yes" if r.within else "NO"
        if r.cause is None:  # healthy: within 5% is not the question, worse than none is
            within = "worse" if r.worse else "-"
        lines.append(f"{r.scenario:<34}{r.strategy:<15}{r.cause or 'healthy':<19}"
                     f"{r.baseline:<27}{r.outcome:>9}{_fmt(r.eval_loss):>10}"
                     f"{_fmt(r.reference):>10}{_fmt3(r.ratio):>8}{within:>10}"
                     f"{r.rolled_back_steps:>12}")
    return "\n".join(lines)


def recovery_summary_lines(totals: dict[str, Any]) -> str:
    per = totals["strategies"]
    within, tolerance = totals["within"], totals["healthy_tolerance"]
    faults = max((v["faults"] for v in per.values()), default=0)
    lines = [f"recoverable faults that finished within {within:.0%} of their healthy baseline's "
             f"final eval loss ({faults} faults):"]
    for strategy, v in per.items():
        share = " n/a" if math.isnan(v["share"]) else f"{100 * v['share']:3.0f}%"
        lines.append(f"  {strategy:<15}{v['recovered']:>3}/{v['faults']:<3} {share}  "
                     f"missed: {', '.join(v['missed']) or 'none'}")
    lines.append(f"healthy scenarios whose final eval loss ends more than {tolerance:.0%} above "
                 f"the unprotected run (or that did not finish):")
    for strategy, v in per.items():
        if strategy == totals["reference_strategy"]:
            continue
        worse = ", ".join(f"{name} x{_fmt(ratio, 3)}" for name, ratio in v["healthy_worse"].items())
        lines.append(f"  {strategy:<15}{len(v['healthy_worse']):>3}/{v['healthy']:<3} "
                     f"{worse}".rstrip())
    spent = [f"{strategy} {v['rolled_back_steps_faults'] + v['rolled_back_steps_healthy']} "
             f"(faults {v['rolled_back_steps_faults']}, healthy {v['rolled_back_steps_healthy']})"
             for strategy, v in per.items()
             if strategy == "recover" or v["rolled_back_steps_faults"]
             or v["rolled_back_steps_healthy"]]
    lines.append(f"rolled-back steps (updates thrown away): {', '.join(spent) or 'none'}")
    target = totals.get("target")
    if target is not None:
        lines.append(
            f"target for recover (>= {target['share_at_least']:.0%} within {within:.0%}, ahead "
            f"of every other strategy, no healthy scenario worse): "
            f"{'MET' if target['met'] else 'MISSED'} (share {'ok' if target['share_met'] else 'NO'}"
            f", ahead {'ok' if target['ahead_of_every_other'] else 'NO'}, healthy "
            f"{'ok' if target['no_healthy_worse'] else 'NO'})")
    return "\n".join(lines)


__all__ = ["HEALTHY_TOLERANCE", "RECOVERY_STRATEGIES", "REFERENCE_STRATEGY", "WITHIN",
           "RecoveryRow", "baseline_of", "baselines", "recovery_rows", "recovery_scenarios",
           "recovery_summary_lines", "recovery_table", "recovery_totals"]
