"""Run the scenario suite and print the table; `--json PATH` also writes every result."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from trainguard import GuardConfig
from trainguard.store.writer import strict_json

from . import all_scenarios
from .metrics import summary_lines, table, totals
from .runner import run_scenario
from .strategies import STRATEGIES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scenarios",
                                     description=__doc__)
    parser.add_argument("--strategies", default="trainguard",
                        help=f"comma-separated, from {', '.join(STRATEGIES)}")
    parser.add_argument("--only", default="",
                        help="comma-separated substrings of scenario names or families")
    parser.add_argument("--policy", default="protect", choices=["observe", "protect", "halt"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write all results here")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: results of chaotic faulty runs depend "
                             "on the thread count, so it is fixed; 0 keeps torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    strategies = [s for s in args.strategies.split(",") if s]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        parser.error(f"unknown strategies: {', '.join(unknown)}")
    scenarios = all_scenarios()
    if args.only:
        keys = [k for k in args.only.split(",") if k]
        scenarios = [s for s in scenarios if any(k in s.name or k == s.family for k in keys)]
    if args.list:
        for s in scenarios:
            print(f"{s.name:<34}{s.family:<12}{s.cause or 'healthy':<20}"
                  f"onset {s.onset_step!s:<6}{s.steps:>5} steps  {s.description}")
        return 0
    by_name = {s.name: s for s in scenarios}
    config = GuardConfig(policy=args.policy, console=False)
    results = []
    started = time.perf_counter()
    for s in scenarios:
        for strategy in strategies:
            result = run_scenario(s, strategy, config=config, seed=args.seed)
            results.append(result)
            print(f"[{time.perf_counter() - started:6.1f}s] {s.name:<34}{strategy:<15}"
                  f"{result.outcome:<9} events {len(result.events):<3} "
                  f"eval {result.final_eval_loss:.4g}  ({result.seconds:.1f}s)",
                  file=sys.stderr, flush=True)
    print(table(results, by_name))
    print()
    summaries = []
    for strategy in strategies:
        summary = totals(results, by_name, strategy)
        summaries.append(summary)
        if strategy == "trainguard":
            print(summary_lines(summary))
    print(f"\nwall time {time.perf_counter() - started:.0f}s for {len(results)} runs")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(strict_json({"results": [r.to_dict() for r in results],
                                                "totals": summaries}), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
