"""Run the scenario suite and print the table; `--json PATH` also writes every result.

`--recovery` runs the recovery benchmark instead: the recoverable faulty scenarios and every
healthy one under none, clip, skip_nonfinite, zclip, protect and recover, each scored against the
healthy baseline of the same model (see `benchmarks.scenarios.recovery`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from trainguard import GuardConfig
from trainguard.store.writer import strict_json

from . import all_scenarios
from .base import Scenario
from .metrics import summary_lines, table, totals
from .recovery import (
    REFERENCE_STRATEGY,
    recovery_rows,
    recovery_scenarios,
    recovery_summary_lines,
    recovery_table,
    recovery_totals,
)
from .runner import RunResult, run_scenario
from .strategies import RECOVERY_STRATEGIES, STRATEGIES

GUARD_STRATEGIES = ("trainguard", "protect", "recover", "protect_clip1", "recover_clip1",
                    "recover_deferred")
"""Strategies that detect and diagnose, whose detection figures are printed."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scenarios",
                                     description=__doc__)
    parser.add_argument("--strategies", default=None,
                        help=f"comma-separated, from {', '.join(STRATEGIES)} (default: trainguard;"
                             f" with --recovery: {','.join(RECOVERY_STRATEGIES)})")
    parser.add_argument("--recovery", action="store_true",
                        help="run the recovery benchmark: recoverable faults and healthy runs "
                             "under every strategy, scored against the healthy baselines")
    parser.add_argument("--only", default="",
                        help="comma-separated substrings of scenario names or families")
    parser.add_argument("--policy", default="protect",
                        choices=["observe", "protect", "halt", "recover"],
                        help="policy of the trainguard strategy (protect and recover fix their "
                             "own)")
    parser.add_argument("--prove", default="auto", choices=["auto", "on", "off"],
                        help="GuardConfig.prove.mode: `on` proves the first incidents of every "
                             "faulty run by replaying their step, and checks that a healthy "
                             "step of every healthy run has nothing to heal")
    parser.add_argument("--prove-budget", type=float, default=None,
                        help="GuardConfig.prove.budget_steps (default: the Guard's)")
    parser.add_argument("--sync", default="blocking", choices=["blocking", "deferred"],
                        help="GuardConfig.sync of every trainguard strategy (deferred needs "
                             "--fused on most scenarios, or it falls back to blocking)")
    parser.add_argument("--fused", action="store_true",
                        help="make each single-process workload's Adam, AdamW or SGD fused "
                             "(what sync='deferred' needs) for every strategy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write all results here")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: results of chaotic faulty runs depend "
                             "on the thread count, so it is fixed; 0 keeps torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    default = ",".join(RECOVERY_STRATEGIES) if args.recovery else "trainguard"
    strategies = [s for s in (args.strategies or default).split(",") if s]
    if args.recovery and REFERENCE_STRATEGY not in strategies:
        strategies.insert(0, REFERENCE_STRATEGY)  # the healthy references
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        parser.error(f"unknown strategies: {', '.join(unknown)}")
    catalogue = all_scenarios()
    scenarios = catalogue
    if args.only:
        keys = [k for k in args.only.split(",") if k]
        scenarios = [s for s in scenarios if any(k in s.name or k == s.family for k in keys)]
    if args.recovery:
        scenarios = recovery_scenarios(scenarios, catalogue)
    if args.list:
        for s in scenarios:
            print(f"{s.name:<34}{s.family:<12}{s.cause or 'healthy':<20}"
                  f"onset {s.onset_step!s:<6}{s.steps:>5} steps  {s.description}")
        return 0
    by_name = {s.name: s for s in scenarios}
    config = GuardConfig(policy=args.policy, sync=args.sync, sinks={"console": False},
                         prove={"mode": args.prove})
    if args.prove_budget is not None:
        config = replace(config, prove=replace(config.prove, budget_steps=args.prove_budget))
    results: list[RunResult] = []
    started = time.perf_counter()
    for s in scenarios:
        for strategy in strategies:
            result = run_scenario(s, strategy, config=config, seed=args.seed,
                                  fused=args.fused and not s.distributed)
            results.append(result)
            print(f"[{time.perf_counter() - started:6.1f}s] {s.name:<34}{strategy:<15}"
                  f"{result.outcome:<9} events {len(result.events):<3} "
                  f"eval {result.final_eval_loss:.4g}  rolled back {result.rolled_back_steps:<4}"
                  f"({result.seconds:.1f}s)", file=sys.stderr, flush=True)
    if args.recovery:
        return _recovery_report(results, by_name, args.json, started)
    print(table(results, by_name))
    print()
    summaries = []
    for strategy in strategies:
        summary = totals(results, by_name, strategy)
        summaries.append(summary)
        if strategy in GUARD_STRATEGIES:
            print(summary_lines(summary))
    print(f"\nwall time {time.perf_counter() - started:.0f}s for {len(results)} runs")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(strict_json({"results": [r.to_dict() for r in results],
                                                "totals": summaries}), indent=1))
    return 0


def _recovery_report(results: list[RunResult], by_name: dict[str, Scenario], path: Path | None,
                     started: float) -> int:
    rows = recovery_rows(results, by_name)
    summary = recovery_totals(rows)
    faults = [r for r in rows if r.cause is not None]
    healthy = [r for r in rows if r.cause is None]
    print("recoverable faults (ratio = final eval loss / the baseline's under "
          f"{REFERENCE_STRATEGY})")
    print(recovery_table(faults))
    print("\nhealthy scenarios (ratio = final eval loss / the same scenario's under "
          f"{REFERENCE_STRATEGY})")
    print(recovery_table(healthy))
    print()
    print(recovery_summary_lines(summary))
    print(f"\nwall time {time.perf_counter() - started:.0f}s for {len(results)} runs")
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(strict_json({
            "results": [r.to_dict() for r in results],
            "recovery": {"rows": [r.to_dict() for r in rows], "totals": summary}}), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
