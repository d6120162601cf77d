"""What trainguard's HF callback adds to a TRL GRPO step (generation included), on the CPU.

    python -m benchmarks.rl_cost                  # 3 pairs of runs, 12 steps each
    python -m benchmarks.rl_cost --pairs 5 --steps 20
    python -m benchmarks.rl_cost --layers 6 --width 256 --completion-length 32   # a larger step

A tiny GPT-2 (2 layers, 64 wide, built from a config) and a character tokenizer built in memory,
`trl.GRPOTrainer` with 4 completions of up to 8 tokens per prompt, 8 prompts a step, a rule
reward: the run of `tests/integrations/trl_runs.py`. Two figures, both from this one script:

- **side by side**: runs without and with `TrainguardCallback`, alternated (A B A B ...), each
  timed step by step by a callback of its own; the median step of each, the first steps (warm-up)
  left out, and the ratio. On a shared 2-core machine the spread between runs is several percent:
  this figure resolves no better.
- **inside**: the time spent in trainguard itself on the guarded runs (its callback's hooks, and
  what its wrapper of the trainer's `compute_loss` and its read of the trainer's metrics do
  beyond the trainer's own work, and its forward hooks on the model's passes, generation's
  included, timed around each call), per step and once a run. It resolves far below the
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integrations.trl_runs import letters_reward, tokenizer

WARMUP = 2
"""Steps of each run left out of its median (the first forward passes, TRL's set-up)."""
HOOKS = ("on_train_begin", "on_step_begin", "on_pre_optimizer_step", "on_step_end",
         "on_log", "on_train_end")


class StepClock(TrainerCallback):
    """The wall time of each optimizer step, from one step's begin to its end, and the seconds
    a stopwatch counted from one step's begin to the next (trainguard's work of each step)."""

    def __init__(self, inside: Stopwatch | None = None) -> None:
        self.begun = 0.0
        self.steps: list[float] = []
        self.inside = inside
        self.counted = 0.0
        self.inside_steps: list[float] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.begun = time.perf_counter()
        if self.inside is not None:
            if self.steps:
                self.inside_steps.append(self.inside.seconds - self.counted)
            self.counted = self.inside.seconds

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps.append(time.perf_counter() - self.begun)


ONCE = ("on_train_begin", "on_train_end")
"""Hooks that run once a run (the preflight audit, the run store, the verdict): not per step."""


class Stopwatch:
    """Seconds spent inside the wrapped callables: per step, and once a run."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.once = 0.0
        self.hooks = 0.0
        """Of `seconds`: trainguard's forward hooks."""
        self._depth = 0  # a call inside another timed one is counted once, in the outer
        self.per_step: list[float] = []
        """Seconds counted in each step but the last, from one step's begin to the next."""

    def wrap(self, fn: Callable[..., Any], name: str = "") -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                spent = time.perf_counter() - start
                if name in ONCE:
                    self.once += spent
                else:
                    self.seconds += spent
                    if name == FORWARD_HOOK:
                        self.hooks += spent
        return timed


FORWARD_HOOK = "forward hook"


def timing_forward_hooks(inside: Stopwatch) -> Callable[[], None]:
    """Forward hooks trainguard registers from now on are timed by `inside`; returns the undo."""
    register = torch.nn.Module.register_forward_hook

    def timed_register(module: torch.nn.Module, hook: Callable[..., Any], *args: Any,
                       **kwargs: Any) -> Any:
        if getattr(hook, "__module__", "").startswith("trainguard"):
            hook = inside.wrap(hook, FORWARD_HOOK)
        return register(module, hook, *args, **kwargs)

    torch.nn.Module.register_forward_hook = timed_register  # type: ignore[method-assign]

    def undo() -> None:
        torch.nn.Module.register_forward_hook = register  # type: ignore[method-assign]
    return undo


@dataclass(frozen=True)
class Size:
    """The policy's shape and the completions' length: trainguard's per-step work is mostly
    fixed per layer, so the share it takes falls as the step grows."""

    layers: int = 2
    width: int = 64
    completion_length: int = 8


def policy(tok: Any, size: Size) -> Any:
    """A GPT-2 of `size` built from its config (the test fixtures' at the default size)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=size.layers, n_embd=size.width, n_head=max(2, size.width // 32),
                        vocab_size=len(tok), n_positions=max(64, size.completion_length + 32),
                        bos_token_id=1, eos_token_id=1, pad_token_id=0, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def run(steps: int, guarded: bool, workdir: Path, size: Size = Size()
        ) -> tuple[list[float], Stopwatch, float]:
    """One GRPO run: its steps' wall times, the seconds spent inside trainguard (none when not
    guarded) and the seconds `trainer.train()` took."""
    import trl
    from datasets import Dataset

    from trainguard import GuardConfig
    from trainguard.hf import TrainguardCallback
    from trainguard.integrations.trl import MetricsTap, ObjectiveTap

    tok = tokenizer()
    model = policy(tok, size)
    rows = [{"prompt": f"say a{i % 5} "} for i in range(64)]
    args = trl.GRPOConfig(per_device_train_batch_size=8, num_generations=4, beta=0.0,
                          max_completion_length=size.completion_length,
                          output_dir=str(workdir), max_steps=steps,
                          learning_rate=1e-3, logging_steps=4, report_to=[], save_strategy="no",
                          seed=0, use_cpu=True, disable_tqdm=True)
    inside = Stopwatch()
    clock = StepClock(inside if guarded else None)
    callbacks: list[Any] = [clock]
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
    undo_hooks = timing_forward_hooks(inside) if guarded else None  # registered at train begin
    start = time.perf_counter()
    try:
        trainer.train()
    finally:
        for (cls, name), fn in zip(taps, originals, strict=True):
            setattr(cls, name, fn)
        if undo_hooks is not None:
            undo_hooks()
    inside.per_step = clock.inside_steps
    return clock.steps, inside, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="runs without and with, alternated")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layers", type=int, default=Size.layers, help="GPT-2 layers")
    parser.add_argument("--width", type=int, default=Size.width, help="GPT-2 width (n_embd)")
    parser.add_argument("--completion-length", type=int, default=Size.completion_length,
                        help="max_completion_length")
    args = parser.parse_args(argv)
    size = Size(args.layers, args.width, args.completion_length)
    torch.set_num_threads(args.threads)
    plain: list[float] = []
    guarded: list[float] = []
    inside = once = trained = hooks = 0.0
    timed_steps = 0
    usual: list[float] = []
    started, cpu_start = time.perf_counter(), os.times()
    with tempfile.TemporaryDirectory(prefix="trainguard-rlcost-") as tmp:
        for i in range(args.pairs):
            for guard in (False, True):
                steps, spent, seconds = run(args.steps, guard, Path(tmp) / f"{i}-{guard}", size)
                (guarded if guard else plain).extend(steps[WARMUP:])
                if guard:
                    inside, once = inside + spent.seconds, once + spent.once
                    hooks += spent.hooks
                    usual.extend(spent.per_step)
                    trained, timed_steps = trained + seconds, timed_steps + len(steps)
                print(f"  pair {i + 1}/{args.pairs} {'guarded' if guard else 'plain  '}: "
                      f"median step {statistics.median(steps[WARMUP:]) * 1e3:.1f} ms")
    wall = time.perf_counter() - started
    cpu = os.times()
    own = (cpu.user - cpu_start.user) + (cpu.system - cpu_start.system)
    a, b = statistics.median(plain), statistics.median(guarded)
    print(f"GRPO step, {args.pairs} pairs x {args.steps} steps (first {WARMUP} of each left out), "
          f"{args.threads} torch thread(s); GPT-2 of {size.layers} layers x {size.width}, "
          f"completions of up to {size.completion_length} tokens")
    print(f"  side by side: plain {a * 1e3:.1f} ms, guarded {b * 1e3:.1f} ms, ratio {b / a:.4f}")
    per_step = inside / max(timed_steps, 1)
    print(f"  inside trainguard, every step (its step hooks, the objective and metrics taps, its "
          f"forward hooks): {per_step * 1e3:.2f} ms a step, {per_step / b:.2%} of the guarded "
          f"median step; of it the forward hooks {hooks / max(timed_steps, 1) * 1e3:.2f} ms")
    if usual:  # the mean above counts the sampled steps (the first, every 50th) of short runs
        typical = statistics.median(usual)
        print(f"  inside trainguard, the usual step (median of steps): {typical * 1e3:.2f} ms, "
              f"{typical / b:.2%} of the guarded median step; the mean above weighs the probes "
              f"of sampled steps (the first, then one in `probes.sample_every`) by this short "
              f"run's length")
    print(f"  inside trainguard, once a run (train begin and end: the audit, the run store, "
          f"the verdict): {once / args.pairs * 1e3:.0f} ms a run; all of it together "
          f"{(inside + once) / trained:.2%} of the guarded runs' {trained:.1f} s of training")
    print(f"  this process used {own / wall:.0%} of one core over {wall:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
