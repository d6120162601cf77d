"""Per-step overhead of `trainguard.hf.TrainguardCallback` on a real `transformers.Trainer`.

What it measures
    The GPT-2 workload of `benchmarks/overhead.py` (n_layer=6, n_embd=384, vocab 8192, batch
    8 x 128, AdamW 1e-4, clipping at 1.0) trained by the Hugging Face Trainer, alone and with the
    trainguard callback (policy protect, default config, no run store).

How
    Each round trains both variants for K steps (`trainer.train()` with max_steps=K, each on its
    own copy of the same initial model), the order alternating between rounds. A timing callback
    records the wall time between consecutive `on_step_begin` calls, so the Trainer's set-up
    (data loader, optimizer, the callback's preflight audit) is not counted, only training steps.
    Reported: ms/step (median over all timed steps of a variant) and the ratio callback / alone
    (median of the per-round ratios of median step times), with its spread over rounds.

Usage
    python benchmarks/hf_overhead.py                  # 5 rounds x 12 steps
    python benchmarks/hf_overhead.py --rounds 8 --steps 20 --json out.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

WARMUP_STEPS = 2
"""Steps at the start of every train() call left out of the timing (first-call effects)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=12, help="steps per train() call")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.steps <= WARMUP_STEPS:
        parser.error(f"--rounds must be >= 1 and --steps > {WARMUP_STEPS}")
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import Trainer, TrainerCallback, TrainingArguments
    from transformers.utils import logging as hf_logging

    import trainguard
    from trainguard.hf import TrainguardCallback

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from overhead import build_workload

    hf_logging.set_verbosity_error()
    workload = build_workload("gpt2", torch.device("cpu"))
    dataset = [{"input_ids": b["input_ids"][i], "labels": b["input_ids"][i]}
               for b in workload.batches for i in range(b["input_ids"].shape[0])]

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.starts: list[float] = []

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.starts.append(time.perf_counter())

        def on_train_end(self, *a: Any, **k: Any) -> None:
            self.starts.append(time.perf_counter())

        def step_times(self) -> list[float]:
            return [b - a for a, b in zip(self.starts, self.starts[1:], strict=False)][
                WARMUP_STEPS:]

    def train(with_guard: bool, out: str) -> list[float]:
        model: nn.Module = copy.deepcopy(workload.model)
        clock = StepClock()
        callbacks: list[Any] = [clock]
        if with_guard:
            callbacks.append(TrainguardCallback(trainguard.GuardConfig(sinks={"console": False})))
        targs = TrainingArguments(output_dir=out, per_device_train_batch_size=8,
                                  max_steps=args.steps, learning_rate=workload.lr,
                                  max_grad_norm=1.0, report_to="none", save_strategy="no",
                                  logging_strategy="no", use_cpu=True, disable_tqdm=True,
                                  seed=0, dataloader_num_workers=0)
        Trainer(model=model, args=targs, train_dataset=dataset, callbacks=callbacks).train()
        return clock.step_times()

    times: dict[str, list[float]] = {"trainer": [], "trainer+trainguard": []}
    ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="trainguard-hf-bench-") as out:
        for r in range(args.rounds):
            order = [False, True] if r % 2 == 0 else [True, False]
            medians = {}
            for with_guard in order:
                name = "trainer+trainguard" if with_guard else "trainer"
                steps = train(with_guard, out)
                times[name].extend(steps)
                medians[name] = statistics.median(steps)
            ratios.append(medians["trainer+trainguard"] / medians["trainer"])
            print(f"  round {r + 1}/{args.rounds}: trainer {medians['trainer'] * 1e3:.1f} ms, "
                  f"with trainguard {medians['trainer+trainguard'] * 1e3:.1f} ms/step",
                  file=sys.stderr, flush=True)
    ordered = sorted(ratios)
    result = {
        "ms_per_step": {k: statistics.median(v) * 1e3 for k, v in times.items()},
        "ratio": statistics.median(ratios), "ratio_min": ordered[0], "ratio_max": ordered[-1],
        "ratios": ratios, "rounds": args.rounds, "steps_per_round": args.steps,
        "torch_threads": torch.get_num_threads(),
    }
    print(f"trainguard {trainguard.__version__}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {args.rounds} rounds x {args.steps} steps "
          f"(first {WARMUP_STEPS} of each call untimed)")
    for name, ms in result["ms_per_step"].items():
        print(f"  {name:<20} {ms:8.1f} ms/step")
    print(f"  ratio (callback / alone, median of rounds) {result['ratio']:.3f}x "
          f"(rounds {ordered[0]:.3f}-{ordered[-1]:.3f}); target <= 1.02x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
