"""trainguard.Guard in an accelerate training loop: mixed precision and gradient accumulation.

    python examples/accelerate_loop.py --steps 60 --poison-step 20

With accelerate the loop stays yours, so the plain-loop Guard drives it. Three rules:

1. Give the Guard the torch optimizer inside the prepared one (`optimizer.optimizer`) and the
   accelerator's GradScaler (`accelerator.scaler`, None except under float16): the Guard then
   unscales, checks, clips, steps and updates the scaler itself, exactly once.
2. Call `guard.step` only at the accumulation boundary (`accelerator.sync_gradients`), with the
   loss of the whole optimizer step (the micro-batch losses averaged, as accelerate's backward
   averages their gradients).
3. Give it the LR scheduler unprepared: the Guard steps it once per applied update (a prepared
   scheduler would also step on the steps the Guard skips).

`--poison-step` turns one optimizer step's loss into NaN to show the Guard skipping it.
"""

from __future__ import annotations

import argparse
import math
import tempfile

import torch
from accelerate import Accelerator

import trainguard
from trainguard.demo import MarkovLanguage, TinyCausalLM


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps")
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per step")
    parser.add_argument("--poison-step", type=int, default=20,
                        help="optimizer step whose loss becomes NaN (-1: none)")
    parser.add_argument("--run-dir", default=None,
                        help="trainguard run store (default: a new temporary directory)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="trainguard-accelerate-")
    torch.manual_seed(0)
    # float16 needs a GPU (and brings a GradScaler); bfloat16 autocast also runs on the CPU
    accelerator = Accelerator(mixed_precision="fp16" if torch.cuda.is_available() else "bf16",
                              gradient_accumulation_steps=args.accumulate)
    language = MarkovLanguage(vocab_size=64, seed=0)
    model = TinyCausalLM(vocab_size=64, d_model=64, n_layer=2, n_head=4, max_len=32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    warmup, total = 10, args.steps

    def schedule(step: int) -> float:
        return min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / total))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    batches = [language.batch(8, 17) for _ in range(args.steps * args.accumulate)]
    loader = torch.utils.data.DataLoader(batches, batch_size=None)  # items are whole batches
    model, prepared_optimizer, loader = accelerator.prepare(model, optimizer, loader)

    guard = trainguard.Guard(accelerator.unwrap_model(model), prepared_optimizer.optimizer,
                             scheduler, accelerator.scaler,
                             config=trainguard.GuardConfig(policy="protect",
                                                           sinks={"console": False}),
                             run_dir=run_dir)
    reports: list[trainguard.StepReport] = []
    step_loss: torch.Tensor | None = None
    with guard:
        for index, batch in enumerate(loader):
            with accelerator.accumulate(model):
                loss = accelerator.unwrap_model(model).loss(batch)
                if index // args.accumulate == args.poison_step:
                    loss = loss * float("nan")
                accelerator.backward(loss)  # divides by the accumulation steps
                part = loss.detach() / args.accumulate  # stays on the device: no sync
                step_loss = part if step_loss is None else step_loss + part
                if accelerator.sync_gradients:
                    reports.append(guard.step(step_loss, batch={"input_ids": batch}))
                    prepared_optimizer.optimizer.zero_grad(set_to_none=True)
                    step_loss = None

    skipped = [r.step for r in reports if r.action == "skipped"]
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    first = sum(r.loss for r in reports[:5] if r.loss is not None) / 5
    last = sum(r.loss for r in reports[-5:] if r.loss is not None) / 5
    print(f"mixed precision {accelerator.mixed_precision}, {len(reports)} optimizer steps of "
          f"{args.accumulate} micro-batches")
    print(f"skipped steps: {skipped}")
    print(f"loss {first:.3f} -> {last:.3f}; weights finite: {finite}")
    print(f"events: {[f'{e.kind}@{e.step}' for e in guard.events]}")
    print(f"run store: {run_dir} (trainguard show {run_dir})")
    return 0 if finite and len(reports) == args.steps else 1


if __name__ == "__main__":
    raise SystemExit(main())
