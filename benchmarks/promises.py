"""Whether trainguard's promises hold, in one table.

    python -m benchmarks.promises                  # the quick form (a few minutes on 2 cores)
    python -m benchmarks.promises --full --seed 1  # every scenario and recoverable fault
    python -m benchmarks.promises --smoke          # a tiny form whose figures mean nothing (CI)
    python -m benchmarks.promises --json benchmarks/results/promises.json

Each row is measured by the benchmark that already owns it; this command only chooses what to
run and puts the figures side by side:

    overhead     `benchmarks/overhead.py`: baseline, clip_grad_norm_ and guard_default timed
                 interleaved in rounds on its MLP and GPT-2 steps; the Guard's added time over
                 clip_grad_norm_'s (each the median over rounds of the variant's block minus the
                 same round's baseline block), and the Guard's added time as a share of the GPT-2
                 step
    detection    `benchmarks.scenarios` under the `trainguard` strategy (policy protect): healthy
                 runs with a warning or worse (false alarms), faults detected (recall) and faults
                 whose top-ranked cause is the true one (top-1)
    recovery     `benchmarks.scenarios.recovery`: each recoverable fault under `recover`, its final
                 held-out loss over its healthy baseline's under no protection
    real logs    `benchmarks/realdata.py`: `trainguard analyze` on the held-out half of the shared
                 evaluation set (`--realdata`, else $TRAINGUARD_REALDATA, else ../shared/realdata
                 beside the repository; "not available" without it) and of the corpus kept here

Which scenarios run (catalogue order, the order of `python -m benchmarks.scenarios --list`):

    quick   the first `--per-family` (1) healthy and the first faulty scenario of every family,
            and the first recoverable fault of every family that has one, with the healthy
            baseline it is measured against; overhead.py's default rounds, as many as fit in
            `--overhead-budget` (120 s) per workload
    full    every scenario, and every recoverable fault with its baseline; every overhead round
    smoke   the first healthy and the first faulty scenario of the first family, the first
            recoverable fault and its baseline, each cut to a few steps; a few overhead rounds

The table states how many scenarios of the suite each figure rests on, so a quick figure is
never taken for the full suite's. Figures are printed, not judged: nothing here fails on a time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import trainguard
from trainguard import GuardConfig
from trainguard.store.writer import strict_json

from . import overhead, realdata
from .scenarios import all_scenarios, run_scenario
from .scenarios.base import Scenario
from .scenarios.metrics import totals
from .scenarios.recovery import REFERENCE_STRATEGY, WITHIN, baseline_of, recovery_rows
from .scenarios.runner import RunResult

DETECTION_STRATEGY = "trainguard"
RECOVERY_STRATEGY = "recover"
OVERHEAD_VARIANTS = ["baseline", "clip_grad_norm_", "guard_default"]
REALDATA_ENV = "TRAINGUARD_REALDATA"
DISTURBED = 0.05
"""Other processes' share of the CPU above which overhead.py calls its timings disturbed."""
SMOKE_STEPS = 12
"""Steps of each scenario in the smoke form: enough to run every stage, too few for figures."""
QUICK_OVERHEAD_BUDGET = 120.0
"""Seconds of timing per overhead workload in the quick form, so that the command keeps to its
few minutes: a machine too slow or too busy for overhead.py's default rounds in that time times
fewer of them, and the table says how many."""


@dataclass
class Plan:
    """What one invocation runs."""

    form: str
    """quick, full or smoke."""
    seed: int
    per_family: int | None
    """First this many healthy and faulty scenarios of each family; None: all of them."""
    steps: int | None = None
    """Every scenario cut to this many steps (the smoke form); None: each its own length."""
    overhead: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per overhead workload: rounds, steps_per_round, warmup (empty: overhead.py's defaults)."""
    overhead_budget: float | None = None
    """Seconds of overhead timing per workload after which no new round starts (each still
    gets `overhead.MIN_ROUNDS`); None: every round."""

    def describe(self) -> str:
        if self.form == "full":
            return "full: every scenario and every recoverable fault"
        if self.form == "smoke":
            return (f"smoke: one healthy, one faulty and one recoverable scenario, {self.steps} "
                    "steps each; its figures mean nothing")
        first = "the first" if self.per_family == 1 else f"the first {self.per_family}"
        return (f"quick: {first} healthy and {first} faulty scenarios of each family, {first} "
                "recoverable faults of each family that has any")


# -- choosing the scenarios -----------------------------------------------------------------------
def _first_of_each_family(scenarios: list[Scenario], keep: Callable[[Scenario], bool],
                          n: int | None) -> list[Scenario]:
    """The first `n` scenarios that `keep` accepts of every family, in catalogue order."""
    taken: dict[str, int] = {}
    chosen = []
    for s in scenarios:
        if keep(s) and (n is None or taken.get(s.family, 0) < n):
            taken[s.family] = taken.get(s.family, 0) + 1
            chosen.append(s)
    return chosen


def detection_subset(catalogue: list[Scenario], plan: Plan) -> list[Scenario]:
    """The scenarios run under the detection strategy, in catalogue order."""
    if plan.form == "smoke":
        first = catalogue[0].family
        family = [s for s in catalogue if s.family == first]
        return [next(s for s in family if s.healthy), next(s for s in family if not s.healthy)]
    healthy = _first_of_each_family(catalogue, lambda s: s.healthy, plan.per_family)
    faulty = _first_of_each_family(catalogue, lambda s: not s.healthy, plan.per_family)
    chosen = {s.name for s in healthy + faulty}
    return [s for s in catalogue if s.name in chosen]


def recovery_subset(catalogue: list[Scenario], plan: Plan) -> list[Scenario]:
    """The recoverable faults run under `recover`."""
    recoverable = [s for s in catalogue if not s.healthy and s.recoverable]
    if plan.form == "smoke":
        return recoverable[:1]
    return _first_of_each_family(catalogue, lambda s: not s.healthy and s.recoverable,
                                 plan.per_family)


def family_count(scenarios: list[Scenario]) -> int:
    return len({s.family for s in scenarios})


# -- measuring ------------------------------------------------------------------------------------
Log = Callable[[str], None]


def measure_overhead(plan: Plan, log: Log) -> dict[str, Any]:
    """Per overhead workload: the Guard's and clip_grad_norm_'s added time per step and the
    baseline step, from one interleaved `overhead.run_workload`."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out: dict[str, Any] = {}
    for name in overhead.WORKLOADS:
        workload = overhead.build_workload(name, device)
        settings = plan.overhead.get(name, {})
        rounds = settings.get("rounds", workload.rounds)
        steps = settings.get("steps_per_round", workload.steps_per_round)
        workload.warmup = settings.get("warmup", workload.warmup)
        log(f"overhead {name}: {rounds} rounds x {steps} steps, warm-up {workload.warmup}")
        load = overhead.ForeignLoad()
        deadline = (None if plan.overhead_budget is None
                    else time.perf_counter() + plan.overhead_budget)
        results = overhead.run_workload(workload, OVERHEAD_VARIANTS, device, rounds, steps, log,
                                        deadline)
        done = len(results["baseline"]["ms_per_step_rounds"])
        out[name] = {"rounds": done, "steps_per_round": steps, "device": str(device),
                     "threads": torch.get_num_threads(), "other_cpu_share": load.share(),
                     **added_times(results)}
    return out


def added_times(results: dict[str, Any]) -> dict[str, float | None]:
    """From `run_workload`'s blocks: the median over rounds of each variant's block minus the
    same round's baseline block (ms per step), their ratio, and the Guard's as a share of the
    baseline step. The ratio is None when clip_grad_norm_ added no time to measure against."""
    base = results["baseline"]["ms_per_step_rounds"]

    def added(variant: str) -> float:
        blocks = results[variant]["ms_per_step_rounds"]
        return statistics.median(v - b for v, b in zip(blocks, base, strict=True))

    guard, clip = added("guard_default"), added("clip_grad_norm_")
    step = statistics.median(base)
    return {"baseline_ms": step, "guard_added_ms": guard, "clip_added_ms": clip,
            "guard_over_clip": guard / clip if clip > 0 else None,
            "guard_share_of_step": guard / step if step > 0 else None}


def run_all(scenarios: list[Scenario], strategy: str, plan: Plan, log: Log,
            started: float) -> list[RunResult]:
    config = GuardConfig(policy="protect", sinks={"console": False})
    results = []
    for s in scenarios:
        result = run_scenario(s, strategy, config=config, seed=plan.seed, steps=plan.steps)
        results.append(result)
        log(f"[{time.perf_counter() - started:6.1f}s] {s.name:<36}{strategy:<11}"
            f"{result.outcome:<9} events {len(result.events):<3} ({result.seconds:.1f}s)")
    return results


def detection_figures(results: list[RunResult], by_name: dict[str, Scenario]) -> dict[str, Any]:
    summary = totals(results, by_name, DETECTION_STRATEGY)
    faulty = [r for r in results if not by_name[r.scenario].healthy]
    return {
        "healthy": summary["healthy"], "faulty": summary["faulty"],
        "false_alarms": len(summary["healthy_with_events"]),
        "healthy_with_events": summary["healthy_with_events"],
        "detected": sum(1 for r in faulty if r.detected), "missed": summary["missed"],
        "top1": sum(1 for r in faulty if r.diagnosis[:1] == [r.cause]),
        "top1_missed": summary["top1_missed"],
    }


def recovery_figures(results: list[RunResult], by_name: dict[str, Scenario]) -> dict[str, Any]:
    """The recover runs' ratios to their baselines; a run that did not end finite counts as the
    worst (an infinite ratio)."""
    rows = [r for r in recovery_rows(results, by_name)
            if r.strategy == RECOVERY_STRATEGY and r.cause is not None]
    ratios = [r.ratio if math.isfinite(r.ratio) else math.inf for r in rows]
    worst = max(range(len(rows)), key=lambda i: ratios[i]) if rows else None
    return {
        "faults": len(rows), "within": sum(1 for r in rows if r.within),
        "median_ratio": statistics.median(ratios) if ratios else None,
        "worst_ratio": ratios[worst] if worst is not None else None,
        "worst": rows[worst].scenario if worst is not None else None,
        "rows": [r.to_dict() for r in rows],
    }


def realdata_folder(given: Path | None) -> Path:
    """`--realdata`, else $TRAINGUARD_REALDATA, else ../shared/realdata beside the repository."""
    if given is not None:
        return given
    env = os.environ.get(REALDATA_ENV)
    return Path(env) if env else realdata.SHARED_DATA


def realdata_figures(folder: Path) -> dict[str, Any] | None:
    """`trainguard analyze` on the held-out half of the corpus in `folder`; None when `folder`
    holds no corpus."""
    if not (folder / "index.csv").is_file():
        return None
    cases, not_kept = realdata.score_corpus(folder, "held-out")
    return {"folder": str(folder), **realdata.totals(cases), "not_kept": len(not_kept),
            "wrong": [c.label.case for c in cases if not realdata.right(c)]}


# -- the table ------------------------------------------------------------------------------------
def _count(part: int, whole: int) -> str:
    return f"{part}/{whole}" + (f" ({100 * part / whole:.0f}%)" if whole else "")


def _ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.3f}"


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _names(names: list[str]) -> str:
    return ", ".join(names) if names else "none"


def table_rows(figures: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(figure, value, what it rests on) for every row of the table."""
    suite = figures["suite"]
    rows: list[tuple[str, str, str]] = []
    for name, o in figures["overhead"].items():
        other = o["other_cpu_share"]
        busy = ("" if other is None else f"; other processes {other:.0%} of the CPU"
                + (" (timings disturbed)" if other > DISTURBED else ""))
        rows.append((f"overhead {name}: guard/clip added time", _ratio(o["guard_over_clip"]),
                     f"guard {o['guard_added_ms']:+.3f} ms, clip {o['clip_added_ms']:+.3f} ms "
                     f"on a {o['baseline_ms']:.2f} ms step, {o['rounds']} rounds x "
                     f"{o['steps_per_round']} steps{busy}"))
    gpt2 = figures["overhead"].get("gpt2")
    if gpt2 is not None:
        share = gpt2["guard_share_of_step"]
        rows.append(("overhead gpt2: guard added time",
                     "-" if share is None else f"{100 * share:.2f}% of a step",
                     f"{gpt2['guard_added_ms']:.2f} ms of {gpt2['baseline_ms']:.1f} ms"))
    d = figures["detection"]
    runs = (f"{d['healthy'] + d['faulty']} of {suite['scenarios']} scenarios, "
            f"{_plural(figures['detection_families'], 'family', 'families')}, "
            f"seed {figures['seed']}")
    rows.append(("false alarms: healthy runs warned", _count(d["false_alarms"], d["healthy"]),
                 f"{d['healthy']} of {suite['healthy']} healthy ({runs}): "
                 f"{_names(d['healthy_with_events'])}"))
    rows.append(("recall: faults detected", _count(d["detected"], d["faulty"]),
                 f"{d['faulty']} of {suite['faulty']} faulty; missed: {_names(d['missed'])}"))
    rows.append(("top-1 cause right", _count(d["top1"], d["faulty"]),
                 f"wrong: {_names(d['top1_missed'])}"))
    r = figures["recovery"]
    of = f"{r['faults']} of {suite['recoverable']} recoverable faults under {RECOVERY_STRATEGY}"
    rows.append(("recover/healthy final loss, median", _ratio(r["median_ratio"]), of))
    rows.append(("recover/healthy final loss, worst", _ratio(r["worst_ratio"]),
                 r["worst"] or "-"))
    rows.append((f"recovered within {WITHIN:.0%}", _count(r["within"], r["faults"]), of))
    for title, real in (("shared set", figures["realdata"]),
                        ("own corpus", figures["realdata_own"])):
        if real is None:
            rows.append((f"real logs ({title}), held-out: all right", "not available",
                         f"no index.csv in {figures['realdata_folder']}"))
            continue
        rows.append((f"real logs ({title}), held-out: all right",
                     _count(real["right"], real["cases"]),
                     f"verdict {real['verdict']}/{real['cases']}, false alarms "
                     f"{real['false_alarms']}/{real['healthy']}, crashed {real['crashed']}"
                     + (f", {real['not_kept']} not kept" if real["not_kept"] else "")))
    return rows


def format_table(rows: list[tuple[str, str, str]]) -> str:
    header = ("figure", "value", "rests on")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(2)]
    lines = [f"{header[0]:<{widths[0]}}  {header[1]:>{widths[1]}}  {header[2]}",
             f"{'-' * widths[0]}  {'-' * widths[1]}  {'-' * len(header[2])}"]
    lines += [f"{a:<{widths[0]}}  {b:>{widths[1]}}  {c}" for a, b, c in rows]
    return "\n".join(lines)


# -- command line ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.promises",
                                     description=__doc__.splitlines()[0])
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--full", action="store_true",
                      help="every scenario and every recoverable fault (about as long as the "
                           "scenario suite and the recovery benchmark's recover runs)")
    form.add_argument("--smoke", action="store_true",
                      help="a tiny form that checks the command runs; its figures mean nothing")
    parser.add_argument("--per-family", type=int, default=1, metavar="N",
                        help="quick form: the first N healthy, faulty and recoverable scenarios "
                             "of each family (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="scenario seed (default 0)")
    parser.add_argument("--overhead-budget", type=float, default=QUICK_OVERHEAD_BUDGET,
                        metavar="SECONDS",
                        help="quick form: start no new overhead round once a workload has been "
                             f"timed this long (default {QUICK_OVERHEAD_BUDGET:.0f}; each gets "
                             f"{overhead.MIN_ROUNDS} rounds at least; the full form times every "
                             "round)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for the overhead timings (default 1: on a shared "
                             "machine with few cores one thread is disturbed least; 0 keeps "
                             "torch's default); the scenarios always run on one")
    parser.add_argument("--realdata", type=Path, default=None, metavar="DIR",
                        help=f"the shared real-log set (default: ${REALDATA_ENV}, else "
                             "../shared/realdata beside the repository)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the figures as JSON to PATH")
    args = parser.parse_args(argv)
    if args.per_family < 1:
        parser.error("--per-family must be >= 1")
    if args.threads < 0:
        parser.error("--threads must be >= 0")
    if args.overhead_budget <= 0:
        parser.error("--overhead-budget must be > 0")
    return args


def make_plan(args: argparse.Namespace) -> Plan:
    if args.full:
        return Plan("full", args.seed, None)
    if args.smoke:
        tiny = {"rounds": overhead.MIN_ROUNDS, "warmup": 0}
        return Plan("smoke", args.seed, 1, steps=SMOKE_STEPS,
                    overhead={"gpt2": {**tiny, "steps_per_round": 1},
                              "mlp": {**tiny, "steps_per_round": 10}})
    return Plan("quick", args.seed, args.per_family, overhead_budget=args.overhead_budget)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = make_plan(args)
    started = time.perf_counter()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    catalogue = all_scenarios()
    by_name = {s.name: s for s in catalogue}
    detection = detection_subset(catalogue, plan)
    faults = recovery_subset(catalogue, plan)
    references = list(dict.fromkeys(baseline_of(s) for s in faults))

    threads = torch.get_num_threads()
    try:
        if args.threads:
            torch.set_num_threads(args.threads)
        over = measure_overhead(plan, log)
        torch.set_num_threads(1)  # as the scenario suite: chaotic runs depend on the thread count
        found = run_all(detection, DETECTION_STRATEGY, plan, log, started)
        recovered = (run_all([by_name[n] for n in references], REFERENCE_STRATEGY, plan, log,
                             started)
                     + run_all(faults, RECOVERY_STRATEGY, plan, log, started))
    finally:
        torch.set_num_threads(threads)
    folder = realdata_folder(args.realdata)
    figures: dict[str, Any] = {
        "form": plan.form, "subset": plan.describe(), "seed": plan.seed,
        "suite": {"scenarios": len(catalogue),
                  "healthy": sum(1 for s in catalogue if s.healthy),
                  "faulty": sum(1 for s in catalogue if not s.healthy),
                  "recoverable": sum(1 for s in catalogue if not s.healthy and s.recoverable),
                  "families": family_count(catalogue)},
        "detection_families": family_count(detection),
        "overhead": over,
        "detection": detection_figures(found, by_name),
        "recovery": recovery_figures(recovered, by_name),
        "realdata_folder": str(folder),
        "realdata": realdata_figures(folder),
        "realdata_own": realdata_figures(realdata.OWN_DATA),
    }
    figures["wall_s"] = time.perf_counter() - started

    print(f"trainguard {trainguard.__version__}, torch {torch.__version__}, python "
          f"{platform.python_version()}; overhead on {over['gpt2']['device']} with "
          f"{over['gpt2']['threads']} torch threads, scenarios on one")
    print(f"{plan.describe()}; seed {plan.seed}")
    print()
    print(format_table(table_rows(figures)))
    print(f"\nwall time {figures['wall_s']:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(strict_json(figures), indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
