"""Time spent in each stage of the Guard's step pipeline, per optimizer step.

Builds the `mlp` and `gpt2` workloads of `benchmarks/overhead.py`, runs a guarded loop
(`GuardConfig(sinks={"console": False})`, no run directory) and wraps every stage of the Guard's
pipeline with a timer. Prints, per workload, the median microseconds per step of each stage (the
median over blocks of steps, so a slow step from elsewhere on the machine moves it little), their
sum, and the whole step (forward, backward, Guard, optimizer) for scale; then each detector's
`check` (inside `detect`), as `detector:<kind>`.

    python benchmarks/stage_profile.py                 # both workloads
    python benchmarks/stage_profile.py --workload mlp --blocks 9 --steps 100
    python benchmarks/stage_profile.py --workload mlp --sync deferred   # fused AdamW
    python benchmarks/stage_profile.py --workload mlp --threads 1 --clock thread

`--budgets` compares each stage and each detector on the `mlp` workload with what it states it
may cost there (`STAGE_BUDGETS_US` below; `Detector.budget_us`), and lists those over: the MLP
step is small and host-bound, the case where the Guard's Python adds most to a step. Use it with
`--clock thread --threads 1` on a shared machine.

`--clock thread` counts the CPU time of the stepping thread (`time.thread_time`) instead of the
wall clock: on a shared, busy machine other processes barely move it (with `--threads 1`, torch's
work runs on that thread too).

Under `--sync deferred` the stages are the device half (`measure_on_device`) and the host half
run a step later (`read_late`, detect, explain, decide, act, settle, record); the optimizer is
AdamW(fused=True), which the deferred mode needs (`--fused` gives the blocking mode the same).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import build_workload
from trainguard import Guard, GuardConfig

DEFAULTS = {"mlp": (9, 100), "gpt2": (7, 4)}
"""Workload -> (blocks, steps per block)."""

STAGE_BUDGETS_US: dict[str, float] = {
    "measure": 320.0,  # the fused norms, the pack, its one transfer, the sampled probes' share
    "detect": 280.0,  # the detectors' own budgets, the batch inspector's first/sampled batches
    "explain": 5.0,  # nothing on a quiet step
    "decide": 30.0,  # the clip limit in force, the policy
    "act": 20.0,  # the optimizer's step is the loop's cost, not the Guard's
    "settle": 65.0,  # the report, counters, the sampling of the next step
    "record": 10.0,  # the sinks (console only here)
}
"""What each blocking stage may cost on the `mlp` workload's usual step, in microseconds of the
stepping thread; measured figures and their history are in docs/benchmarks.md."""


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter,
                                          "thread": time.thread_time}


def _timed(stage: Any, spent: dict[str, float], name: str | None = None,
           clock: Callable[[], float] = time.perf_counter) -> Callable[..., Any]:
    name = name or getattr(stage, "name", None) or stage.__name__

    def timed(*args: Any) -> Any:
        start = clock()
        try:
            return stage(*args)  # stages hand typed results on to the next
        finally:
            spent[name] += clock() - start

    timed.__name__ = name
    timed.name = name  # type: ignore[attr-defined]
    return timed


def profile(workload_name: str, blocks: int, steps: int, sync: str = "blocking",
            fused: bool = False, clock: str = "wall") -> dict[str, float]:
    """Median microseconds per step, per stage, per detector and for the whole step."""
    now = CLOCKS[clock]
    workload = build_workload(workload_name, torch.device("cpu"))
    model = workload.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=workload.lr,
                                  fused=True if fused or sync == "deferred" else None)
    guard = Guard(model, optimizer, config=GuardConfig(sync=sync, sinks={"console": False}))  # type: ignore[arg-type]
    spent: dict[str, float] = defaultdict(float)
    pipeline = guard.run.steps
    for part in ("before", "after"):
        setattr(pipeline, part, tuple(_timed(s, spent, clock=now)
                                      for s in getattr(pipeline, part)))
    deferral = guard.run.deferral
    for part in ("on_device", "late_stages") if deferral is not None else ():
        setattr(deferral, part, tuple(_timed(s, spent, clock=now)
                                      for s in getattr(deferral, part)))
    detector_times: dict[str, float] = defaultdict(float)  # inside detect: not in the sum
    for detector in guard.run.state.detectors:
        detector.check = _timed(detector.check, detector_times,  # type: ignore[method-assign]
                                f"detector:{detector.kind}", now)
    per_block: dict[str, list[float]] = defaultdict(list)
    batches = workload.batches
    for block in range(blocks + 1):  # the first block warms up
        spent.clear()
        # a detector idle on every step of the block (`detect/on_duty.py`) is not called: 0
        detector_times.clear()
        detector_times.update({f"detector:{d.kind}": 0.0 for d in guard.run.state.detectors})
        start = now()
        for i in range(steps):
            loss = workload.compute_loss(model, batches[(block * steps + i) % len(batches)])
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad(set_to_none=True)
        whole = now() - start
        if block:
            for name, seconds in spent.items():
                per_block[name].append(seconds / steps * 1e6)
            per_block["(stages together)"].append(sum(spent.values()) / steps * 1e6)
            per_block["(whole step)"].append(whole / steps * 1e6)
            for name, seconds in detector_times.items():
                per_block[name].append(seconds / steps * 1e6)
    guard.close()
    return {name: statistics.median(values) for name, values in per_block.items()}


def budgets(result: dict[str, float]) -> list[tuple[str, float, float]]:
    """(name, measured, budget) of each stage and detector in `result` that states a budget."""
    from trainguard.detect import DETECTOR_TYPES

    stated = dict(STAGE_BUDGETS_US)
    stated.update({f"detector:{d.kind}": d.budget_us for d in DETECTOR_TYPES})
    return [(name, result[name], stated[name]) for name in result if name in stated]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["mlp", "gpt2", "all"], default="all")
    parser.add_argument("--blocks", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--sync", choices=["blocking", "deferred"], default="blocking")
    parser.add_argument("--fused", action="store_true",
                        help="AdamW(fused=True) (always so under --sync deferred)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or the stepping thread's CPU time")
    parser.add_argument("--budgets", action="store_true",
                        help="on the mlp workload: each stage and detector against its budget")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for name in (["mlp", "gpt2"] if args.workload == "all" else [args.workload]):
        blocks, steps = DEFAULTS[name]
        result = profile(name, args.blocks or blocks, args.steps or steps, args.sync,
                         args.fused, args.clock)
        print(f"{name} ({args.sync}, {args.clock} clock): median us per step over blocks")
        judged = ({n: b for n, _, b in budgets(result)}
                  if args.budgets and name == "mlp" else {})
        for stage, micros in result.items():
            budget = judged.get(stage)
            said = "" if budget is None else (
                f"  budget {budget:7.1f}" + ("  OVER" if micros > budget else ""))
            print(f"  {stage:<32} {micros:10.1f}{said}")
        over = [n for n, m, b in budgets(result) if m > b] if judged else []
        if judged:
            print(f"  within budget: {len(judged) - len(over)} of {len(judged)}"
                  + (f"; over: {', '.join(over)}" if over else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
