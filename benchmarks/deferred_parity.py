"""Does `sync="deferred"` decide as the default blocking mode? The scenario suite, run twice.

    python -m benchmarks.deferred_parity                     # every single-process scenario
    python -m benchmarks.deferred_parity --policy recover --only gpt2,lstm
    python -m benchmarks.deferred_parity --json benchmarks/results/deferred_parity.json

Each single-process scenario runs under the trainguard strategy twice, from the same seed and
with its Adam, AdamW or SGD made fused (what the deferred mode needs to skip on the device): once
with `sync="blocking"`, once with `sync="deferred"`. Per run it reports whether the two took the
same action at every step (applied, clipped, skipped, rolled back, halted, step by step), the
largest difference of a clip factor, whether the actions the sinks heard (skip, rollback, halt,
LR change, with their steps) and the events (kinds and steps) are the same, whether the final
weights are bit for bit equal (else the largest |dW|), and the runs whose deferred Guard fell back
to blocking, with the reason it gave.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from trainguard import GuardConfig
from trainguard.store.writer import strict_json

from .scenarios import all_scenarios
from .scenarios.base import Scenario, Workload
from .scenarios.runner import RunResult, run_scenario
from .scenarios.strategies import GuardStepper, Stepper

FALLBACK = "sync='deferred' is not available here ("


@dataclass
class Trace:
    """What one run did, as its Guard's sinks heard it."""
    steps: list[tuple[int, str, float]] = field(default_factory=list)
    """Each reported step: (step, action, clip factor)."""
    actions: list[tuple[str, int]] = field(default_factory=list)
    events: list[tuple[str, int]] = field(default_factory=list)
    weights: list[torch.Tensor] = field(default_factory=list)
    deferred: bool = False
    fallback: str = ""


@dataclass
class Parity:
    scenario: str
    family: str
    cause: str | None
    outcome: tuple[str, str]
    deferred: bool
    fallback: str
    same_steps: bool
    first_step_differing: int | None
    max_coef_diff: float
    same_actions: bool
    same_events: bool
    events_only_blocking: list[tuple[str, int]]
    events_only_deferred: list[tuple[str, int]]
    identical_weights: bool
    max_abs_dw: float
    rollbacks: tuple[int, int]
    final_eval: tuple[float, float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def traced_run(scenario: Scenario, config: GuardConfig, seed: int, steps: int | None = None
               ) -> tuple[RunResult, Trace]:
    trace = Trace()
    said = _Said()
    logger = logging.getLogger("trainguard")
    logger.addHandler(said)

    def keep(workload: Workload, stepper: Stepper) -> None:
        assert isinstance(stepper, GuardStepper)
        log = stepper.log
        trace.steps = [(r.step, r.action, r.clip_coef) for r in log.reports]
        trace.actions = [(a.kind, a.step) for a in log.actions]
        trace.events = [(e.kind, e.step) for e in stepper.guard.events]
        trace.weights = [p.detach().clone() for p in workload.model.parameters()]
        trace.deferred = stepper.guard.run.deferred

    try:
        result = run_scenario(scenario, "trainguard", config=config, seed=seed, fused=True,
                              steps=steps, inspect=keep)
    finally:
        logger.removeHandler(said)
    reasons = [m for m in said.messages if FALLBACK in m]
    if reasons:
        trace.fallback = reasons[0].split(FALLBACK, 1)[1].split("); every step")[0]
    return result, trace


def compare(scenario: Scenario, blocking: tuple[RunResult, Trace],
            deferred: tuple[RunResult, Trace]) -> Parity:
    (b_result, b), (d_result, d) = blocking, deferred
    b_steps = {s: (a, c) for s, a, c in b.steps}
    d_steps = {s: (a, c) for s, a, c in d.steps}
    differing = sorted(s for s in b_steps.keys() | d_steps.keys()
                       if (b_steps.get(s) or ("", 0.0))[0] != (d_steps.get(s) or ("", 0.0))[0])
    coef = max((abs(b_steps[s][1] - d_steps[s][1]) for s in b_steps.keys() & d_steps.keys()),
               default=0.0)
    dw, identical = 0.0, len(b.weights) == len(d.weights)
    for p, q in zip(b.weights, d.weights, strict=False):
        if not torch.equal(p, q):
            identical = False
            diff = (p.double() - q.double()).abs()
            finite = diff[torch.isfinite(diff)]
            dw = max(dw, float(finite.max()) if finite.numel() else math.inf)
    b_events, d_events = list(b.events), list(d.events)
    only_b = [e for e in b_events if e not in d_events]
    only_d = [e for e in d_events if e not in b_events]
    return Parity(
        scenario=scenario.name, family=scenario.family, cause=scenario.cause,
        outcome=(b_result.outcome, d_result.outcome), deferred=d.deferred, fallback=d.fallback,
        same_steps=not differing, first_step_differing=differing[0] if differing else None,
        max_coef_diff=coef, same_actions=b.actions == d.actions,
        same_events=b_events == d_events, events_only_blocking=only_b,
        events_only_deferred=only_d, identical_weights=identical, max_abs_dw=dw,
        rollbacks=(b_result.rolled_back_steps, d_result.rolled_back_steps),
        final_eval=(b_result.final_eval_loss, d_result.final_eval_loss))


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def table(rows: list[Parity]) -> str:
    lines = [f"{'scenario':<36}{'mode':<10}{'steps':<7}{'coef':>9}  {'acts':<6}{'events':<8}"
             f"{'weights':<9}{'max|dW|':>10}  outcome"]
    for r in rows:
        mode = "deferred" if r.deferred else "fallback"
        steps = _yes(r.same_steps) if r.same_steps else f"@{r.first_step_differing}"
        lines.append(
            f"{r.scenario:<36}{mode:<10}{steps:<7}{r.max_coef_diff:>9.2g}  "
            f"{_yes(r.same_actions):<6}{_yes(r.same_events):<8}"
            f"{'equal' if r.identical_weights else 'differ':<9}{r.max_abs_dw:>10.3g}  "
            f"{r.outcome[0]}" + ("" if r.outcome[0] == r.outcome[1] else f"/{r.outcome[1]}"))
    return "\n".join(lines)


def summary(rows: list[Parity]) -> dict[str, Any]:
    deferred = [r for r in rows if r.deferred]
    return {
        "runs compared": len(rows),
        "deferred (no fallback)": len(deferred),
        "identical step actions": sum(r.same_steps for r in deferred),
        "identical action records": sum(r.same_actions for r in deferred),
        "identical events": sum(r.same_events for r in deferred),
        "bit-identical weights": sum(r.identical_weights for r in deferred),
        "max |dW| over the rest": max((r.max_abs_dw for r in deferred
                                       if not r.identical_weights), default=0.0),
        "fallbacks": {r.scenario: r.fallback for r in rows if not r.deferred},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.deferred_parity",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="",
                        help="comma-separated substrings of scenario names or families")
    parser.add_argument("--policy", default="protect",
                        choices=["observe", "protect", "halt", "recover"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    scenarios = [s for s in all_scenarios() if not s.distributed]
    if args.only:
        keys = [k for k in args.only.split(",") if k]
        scenarios = [s for s in scenarios if any(k in s.name or k == s.family for k in keys)]
    config = GuardConfig(policy=args.policy, sinks={"console": False})
    rows: list[Parity] = []
    started = time.perf_counter()
    for s in scenarios:
        blocking = traced_run(s, replace(config, sync="blocking"), args.seed)
        deferred = traced_run(s, replace(config, sync="deferred"), args.seed)
        row = compare(s, blocking, deferred)
        rows.append(row)
        print(f"[{time.perf_counter() - started:6.1f}s] {s.name:<36}"
              f"{'deferred' if row.deferred else 'fallback':<9} steps {_yes(row.same_steps):<4}"
              f"weights {'equal' if row.identical_weights else f'{row.max_abs_dw:.3g}'}",
              file=sys.stderr, flush=True)
    print(table(rows))
    print()
    totals = summary(rows)
    for key, value in totals.items():
        if key == "fallbacks":
            print(f"fallbacks: {len(value)}")
            for name, why in value.items():
                print(f"  {name}: {why}")
        else:
            print(f"{key}: {value}")
    print(f"\nwall time {time.perf_counter() - started:.0f}s for {2 * len(rows)} runs")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(strict_json(
            {"policy": args.policy, "seed": args.seed, "rows": [r.to_dict() for r in rows],
             "totals": totals}), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
