"""Kill a guarded training loop at random moments and measure what its run store kept.

What it measures
    signals   each trial trains a tiny model with a `Guard` (run_dir set, no `close()`, every
              other trial inside `with guard:`), sends SIGTERM, SIGINT, SIGHUP or SIGQUIT (in
              turn) at a random moment, and records how long the process took to end, how it
              ended, and the run's status in the store (it must be "interrupted").
    sigkill   each trial kills the loop with SIGKILL at a random moment and compares the steps
              the loop had completed (a counter in shared memory, written after every
              `guard.step`) with the steps the store holds: the steps lost.

How
    One helper process imports torch and trainguard once and forks every trial from there
    (a fork costs milliseconds, an import seconds); trials run two at a time. Each trial
    trains `Linear(16, 32) - Tanh - Linear(32, 1)` with SGD on one fixed batch, padding every
    step to `--step-ms` with a busy loop (the training thread keeps the GIL, the hardest case
    for the background writer), waits until the loop has taken `--warmup` steps, then a random
    0-`--max-delay` seconds more before the signal.

Usage
    python -m benchmarks.kill_trials sigkill --trials 50 --step-ms 1
    python -m benchmarks.kill_trials signals --trials 100
    python -m benchmarks.kill_trials signals --trials 20 --json     # one JSON object
    python -m benchmarks.kill_trials overhead       # us per step: plain, Guard, Guard + store
    TRAINGUARD_WRITER_SET=COMMIT_AT_STEPS=1 python -m benchmarks.kill_trials sigkill
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import resource
import select
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
SLOT = 8  # bytes of shared memory per trial: the number of completed steps


def _train(run_dir: str, step_ms: float, counter: mmap.mmap, slot: int, ready_fd: int,
           warmup: int, use_with: bool) -> None:
    """The forked trial: train until killed; never returns normally."""
    import torch
    from torch import nn

    import trainguard

    torch.set_num_threads(1)
    torch.manual_seed(slot)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    guard = trainguard.Guard(model, optimizer,
                             config=trainguard.GuardConfig(sinks={"console": False}),
                             run_dir=run_dir)

    def loop() -> None:
        step = 0
        while True:
            start = time.perf_counter()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad(set_to_none=True)
            step += 1
            struct.pack_into("<q", counter, slot * SLOT, step)
            if step == warmup:
                os.write(ready_fd, b"r")
                os.close(ready_fd)
            while time.perf_counter() - start < step_ms / 1000:
                pass

    if use_with:
        with guard:
            loop()
    else:
        loop()


def _uses_with(slot: int) -> bool:
    """Every signal is sent both to loops inside `with guard:` and to loops without it."""
    return (slot // len(SIGNALS)) % 2 == 1


def _completed(counter: mmap.mmap, slot: int) -> int:
    return struct.unpack_from("<q", counter, slot * SLOT)[0]


def _store(run_dir: str) -> tuple[str | None, int]:
    from trainguard import RunReader

    try:
        with RunReader(run_dir) as reader:
            summary = reader.summary()
    except Exception as exc:  # a trial whose store cannot be read is reported as such
        return f"unreadable: {exc}", 0
    return summary["status"], summary["steps"]


def _helper(kind: str, trials: int, step_ms: float, warmup: int, max_delay: float,
            seed: int, root: str) -> dict[str, Any] | None:
    """Runs in the helper process. Returns the results there; in a forked trial it returns
    None after the trial's training ended (the caller then exits normally)."""
    # imported once, before any fork (the first optimizer step imports dynamo: seconds each)
    import torch._dynamo  # noqa: F401

    import trainguard  # noqa: F401

    _apply_settings()
    rng = random.Random(seed)
    counter = mmap.mmap(-1, SLOT * trials)
    results: list[dict[str, Any]] = []
    for first in range(0, trials, 2):
        batch = list(range(first, min(first + 2, trials)))
        running: dict[int, dict[str, Any]] = {}
        for slot in batch:
            run_dir = os.path.join(root, f"trial{slot}")
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:  # the trial: train as the main program, exit as it would
                os.close(read_fd)
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGQUIT would dump core
                # as a training script started from a terminal: a background launch ignores
                # SIGINT and SIGQUIT, which trainguard then rightly leaves ignored
                signal.signal(signal.SIGINT, signal.default_int_handler)
                for default in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
                    signal.signal(default, signal.SIG_DFL)
                _train(run_dir, step_ms, counter, slot, write_fd, warmup, use_with=_uses_with(slot))
                return None
            os.close(write_fd)
            signum = signal.SIGKILL if kind == "sigkill" else SIGNALS[slot % len(SIGNALS)]
            running[pid] = {"trial": slot, "run_dir": run_dir, "ready": read_fd,
                            "signal": signal.Signals(signum).name, "signum": signum,
                            "with": _uses_with(slot)}
        for info in running.values():  # wait for the warm-up steps, then a random delay each
            ready, _, _ = select.select([info["ready"]], [], [], 120)
            os.close(info["ready"])
            info["kill_at"] = time.monotonic() + rng.uniform(0, max_delay)
            info["failed_start"] = not ready
        for pid, info in sorted(running.items(), key=lambda item: item[1]["kill_at"]):
            time.sleep(max(0.0, info["kill_at"] - time.monotonic()))
            info["completed_before"] = _completed(counter, info["trial"])
            os.kill(pid, info["signum"])
            info["sent"] = time.monotonic()
        waiting = dict(running)
        deadline = time.monotonic() + 60
        while waiting and time.monotonic() < deadline:
            for pid in list(waiting):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    info = waiting.pop(pid)
                    info["exit_s"] = time.monotonic() - info["sent"]
                    info["returncode"] = (-os.WTERMSIG(status) if os.WIFSIGNALED(status)
                                          else os.WEXITSTATUS(status))
            time.sleep(0.001)
        for pid, info in waiting.items():  # hung: note it and end it
            info["exit_s"] = None
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            info["returncode"] = None
        for info in running.values():
            status, steps = _store(info["run_dir"])
            completed = _completed(counter, info["trial"])
            results.append({
                "trial": info["trial"], "signal": info["signal"], "with": info["with"],
                "exit_s": info["exit_s"], "returncode": info["returncode"], "status": status,
                "completed": completed, "stored": steps,
                "lost": max(0, completed - steps)})
    return {"kind": kind, "step_ms": step_ms, "trials": sorted(results,
                                                               key=lambda r: r["trial"])}


def _apply_settings() -> None:
    """`TRAINGUARD_WRITER_SET="COMMIT_AT_STEPS=1,MAX_UNCOMMITTED_STEPS=2"`: try other writer
    constants (`trainguard.store.writer`) in this process and the trials it forks."""
    from trainguard.store import writer

    for item in filter(None, os.environ.get("TRAINGUARD_WRITER_SET", "").split(",")):
        name, value = item.split("=")
        setattr(writer, name.strip(), type(getattr(writer, name.strip()))(value))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    trials = result["trials"]
    if result["kind"] == "sigkill":
        lost = [t["lost"] for t in trials]
        return {"trials": len(trials), "lost_min": min(lost),
                "lost_median": statistics.median(lost), "lost_p95": percentile(lost, 95),
                "lost_max": max(lost),
                "histogram": {str(k): lost.count(k) for k in sorted(set(lost))}}
    fast = [t for t in trials if t["exit_s"] is not None and t["exit_s"] <= 2.0]
    interrupted = [t for t in trials if t["status"] == "interrupted"]
    by_signal = {}
    for name in sorted({t["signal"] for t in trials}):
        mine = [t for t in trials if t["signal"] == name]
        by_signal[name] = {"trials": len(mine),
                           "exit_within_2s": sum(t in fast for t in mine),
                           "interrupted": sum(t in interrupted for t in mine),
                           "killed_by_signal": sum(t["returncode"] == -signal.Signals[name]
                                                   for t in mine)}
    exits = [t["exit_s"] for t in trials if t["exit_s"] is not None]
    return {"trials": len(trials), "exit_within_2s": len(fast), "interrupted": len(interrupted),
            "exit_s_median": statistics.median(exits) if exits else None,
            "exit_s_max": max(exits) if exits else None, "by_signal": by_signal}


def run(kind: str, trials: int, *, step_ms: float = 1.0, warmup: int = 20,
        max_delay: float = 0.3, seed: int = 0) -> dict[str, Any]:
    """Run the trials in a fresh helper process; returns the per-trial results."""
    root = tempfile.mkdtemp(prefix="tg-kill-")
    src = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(src / "src"), str(src), os.environ.get("PYTHONPATH", "")])}
    code = ("import json, sys\n"
            "from benchmarks.kill_trials import _helper\n"
            f"out = _helper({kind!r}, {trials}, {step_ms}, {warmup}, {max_delay}, {seed}, "
            f"{root!r})\n"
            "if out is not None:\n"
            "    sys.stdout.write('RESULT ' + json.dumps(out) + '\\n')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"the trials failed ({proc.returncode}): {proc.stderr[-3000:]}")
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    return json.loads(line[len("RESULT "):])


def step_overhead(steps: int = 3000, rounds: int = 5) -> dict[str, float]:
    """Median microseconds per step of the trials' tiny loop (unpadded): plain, with a Guard and
    no store, with a Guard and its run store. The store's cost is the last minus the middle."""
    import torch
    from torch import nn

    import trainguard

    _apply_settings()
    torch.set_num_threads(1)
    times: dict[str, list[float]] = {"plain": [], "guard": [], "guard+store": []}
    for _ in range(rounds):
        for variant in times:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
            x, y = torch.randn(8, 16), torch.randn(8, 1)
            root = tempfile.mkdtemp(prefix="tg-overhead-")
            guard = None if variant == "plain" else trainguard.Guard(
                model, optimizer, config=trainguard.GuardConfig(sinks={"console": False}),
                run_dir=root if variant == "guard+store" else None)
            start = time.perf_counter()
            for _ in range(steps):
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                if guard is None:
                    optimizer.step()
                else:
                    guard.step(loss)
                optimizer.zero_grad(set_to_none=True)
            times[variant].append((time.perf_counter() - start) / steps * 1e6)
            if guard is not None:
                guard.close()
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=("signals", "sigkill", "overhead"))
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--step-ms", type=float, default=1.0)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--max-delay", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.kind == "overhead":
        per_step = step_overhead()
        print("us/step (median of 5 rounds of 3000 steps): " + "  ".join(
            f"{k} {v:.0f}" for k, v in per_step.items())
              + f"  store cost {per_step['guard+store'] - per_step['guard']:.0f}")
        return 0
    result = run(args.kind, args.trials, step_ms=args.step_ms, warmup=args.warmup,
                 max_delay=args.max_delay, seed=args.seed)
    summary = summarize(result)
    if args.json:
        print(json.dumps({"summary": summary, **result}))
        return 0
    if args.kind == "sigkill":
        print(f"SIGKILL on a {args.step_ms:g} ms/step loop, {summary['trials']} kills: steps lost "
              f"min {summary['lost_min']}  median {summary['lost_median']:g}  "
              f"p95 {summary['lost_p95']}  max {summary['lost_max']}")
        print("histogram (steps lost: kills): " + ", ".join(
            f"{k}: {v}" for k, v in summary["histogram"].items()))
    else:
        print(f"{summary['trials']} signals: {summary['exit_within_2s']} exited within 2 s, "
              f"{summary['interrupted']} left the run 'interrupted' (exit median "
              f"{summary['exit_s_median']:.3f} s, max {summary['exit_s_max']:.3f} s)")
        for name, counts in summary["by_signal"].items():
            print(f"  {name:8} {counts}")
        for trial in result["trials"]:
            if trial["status"] != "interrupted" or trial["exit_s"] is None or \
                    trial["exit_s"] > 2.0:
                print(f"  failed: {trial}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
