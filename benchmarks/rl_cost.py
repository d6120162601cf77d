"""What trainguard's HF callback adds to a TRL GRPO step (generation included), on the CPU.

    python -m benchmarks.rl_cost                  # 3 pairs of runs, 12 steps each
    python -m benchmarks.rl_cost --pairs 5 --steps 20

A tiny GPT-2 (2 layers, 64 wide, built from a config) and a character tokenizer built in memory,
`trl.GRPOTrainer` with 4 completions of up to 8 tokens per prompt, 8 prompts a step, a rule
reward: the run of `tests/integrations/trl_runs.py`. Two figures, both from this one script:

- **side by side**: runs without and with `TrainguardCallback`, alternated (A B A B ...), each
  timed step by step by a callback of its own; the median step of each, the first steps (warm-up)
  left out, and the ratio. On a shared 2-core machine the spread between runs is several percent:
  this figure resolves no better.
- **inside**: the time spent in trainguard itself on the guarded runs (its callback's hooks, and
  what its wrapper of the trainer's `compute_loss` and its read of the trainer's metrics do
  beyond the trainer's own work, timed around each call), per step and once a run. It leaves
  out what trainguard's forward hooks add to the model's passes, but resolves far below the
  side-by-side spread.

The target of the RL work: at most 1% of a GRPO step. Prints the load of other processes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integrations.trl_runs import letters_reward, tiny_gpt2, tokenizer

WARMUP = 2
"""Steps of each run left out of its median (the first forward passes, TRL's set-up)."""
HOOKS = ("on_train_begin", "on_step_begin", "on_pre_optimizer_step", "on_step_end",
         "on_log", "on_train_end")


class StepClock(TrainerCallback):
    """The wall time of each optimizer step, from one step's begin to its end."""

    def __init__(self) -> None:
        self.begun = 0.0
        self.steps: list[float] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.begun = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps.append(time.perf_counter() - self.begun)


ONCE = ("on_train_begin", "on_train_end")
"""Hooks that run once a run (the preflight audit, the run store, the verdict): not per step."""


class Stopwatch:
    """Seconds spent inside the wrapped callables: per step, and once a run."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.once = 0.0

    def wrap(self, fn: Callable[..., Any], name: str = "") -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                if name in ONCE:
                    self.once += spent
                else:
                    self.seconds += spent
        return timed


def run(steps: int, guarded: bool, workdir: Path) -> tuple[list[float], Stopwatch, float]:
    """One GRPO run: its steps' wall times, the seconds spent inside trainguard (none when not
    guarded) and the seconds `trainer.train()` took."""
    import trl
    from datasets import Dataset

    from trainguard import GuardConfig
    from trainguard.hf import TrainguardCallback
    from trainguard.integrations.trl import MetricsTap, ObjectiveTap

    tok = tokenizer()
    model = tiny_gpt2(tok, seed=0)
    rows = [{"prompt": f"say a{i % 5} "} for i in range(64)]
    args = trl.GRPOConfig(per_device_train_batch_size=8, num_generations=4, beta=0.0,
                          max_completion_length=8, output_dir=str(workdir), max_steps=steps,
                          learning_rate=1e-3, logging_steps=4, report_to=[], save_strategy="no",
                          seed=0, use_cpu=True, disable_tqdm=True)
    clock = StepClock()
    callbacks: list[Any] = [clock]
    inside = Stopwatch()
    if guarded:
        guard = TrainguardCallback(GuardConfig(sinks={"console": False}))
        for hook in HOOKS:
            if hasattr(guard, hook):
                setattr(guard, hook, inside.wrap(getattr(guard, hook), hook))
        callbacks.append(guard)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=[letters_reward], args=args,
                              train_dataset=Dataset.from_list(rows), processing_class=tok,
                              callbacks=callbacks)
    taps = [(ObjectiveTap, "_take"), (MetricsTap, "take")]
    originals = [getattr(cls, name) for cls, name in taps]
    if guarded:  # what the objective's wrapper adds to `compute_loss`, not compute_loss itself
        for (cls, name), fn in zip(taps, originals, strict=True):
            setattr(cls, name, inside.wrap(fn))
    start = time.perf_counter()
    try:
        trainer.train()
    finally:
        for (cls, name), fn in zip(taps, originals, strict=True):
            setattr(cls, name, fn)
    return clock.steps, inside, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="runs without and with, alternated")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    plain: list[float] = []
    guarded: list[float] = []
    inside = once = trained = 0.0
    timed_steps = 0
    started, cpu_start = time.perf_counter(), os.times()
    with tempfile.TemporaryDirectory(prefix="trainguard-rlcost-") as tmp:
        for i in range(args.pairs):
            for guard in (False, True):
                steps, spent, seconds = run(args.steps, guard, Path(tmp) / f"{i}-{guard}")
                (guarded if guard else plain).extend(steps[WARMUP:])
                if guard:
                    inside, once = inside + spent.seconds, once + spent.once
                    trained, timed_steps = trained + seconds, timed_steps + len(steps)
                print(f"  pair {i + 1}/{args.pairs} {'guarded' if guard else 'plain  '}: "
                      f"median step {statistics.median(steps[WARMUP:]) * 1e3:.1f} ms")
    wall = time.perf_counter() - started
    cpu = os.times()
    own = (cpu.user - cpu_start.user) + (cpu.system - cpu_start.system)
    a, b = statistics.median(plain), statistics.median(guarded)
    print(f"GRPO step, {args.pairs} pairs x {args.steps} steps (first {WARMUP} of each left out), "
          f"{args.threads} torch thread(s)")
    print(f"  side by side: plain {a * 1e3:.1f} ms, guarded {b * 1e3:.1f} ms, ratio {b / a:.4f}")
    per_step = inside / max(timed_steps, 1)
    print(f"  inside trainguard, every step (its step hooks, the objective and metrics taps): "
          f"{per_step * 1e3:.2f} ms a step, {per_step / b:.2%} of the guarded median step")
    print(f"  inside trainguard, once a run (train begin and end: the audit, the run store, "
          f"the verdict): {once / args.pairs * 1e3:.0f} ms a run; all of it together "
          f"{(inside + once) / trained:.2%} of the guarded runs' {trained:.1f} s of training")
    print(f"  this process used {own / wall:.0%} of one core over {wall:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
