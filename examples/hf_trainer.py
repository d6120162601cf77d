"""trainguard in a Hugging Face Trainer run: one callback.

    python examples/hf_trainer.py --steps 60 --poison-step 25

A tiny GPT-2 (built from a config, nothing downloaded) learns a synthetic Markov language.
`--poison-step` makes one optimizer step's forward pass produce NaN, as a numerical blow-up
would: trainguard names the step, skips it (the weights stay finite) and training goes on. Run
with `--no-guard` to see the same run end with NaN weights while the Trainer logs finite losses.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from typing import Any

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import trainguard
from trainguard.demo import MarkovLanguage
from trainguard.hf import TrainguardCallback


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps")
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step")
    parser.add_argument("--poison-step", type=int, default=25,
                        help="optimizer step whose forward pass yields NaN (-1: none)")
    parser.add_argument("--no-guard", action="store_true", help="train without trainguard")
    parser.add_argument("--workdir", default=None,
                        help="Trainer output and trainguard run store (default: a temporary dir)")
    return parser.parse_args(argv)


def poison_forward(module: nn.Module, micro_batch: int) -> None:
    """Make the `micro_batch`-th training forward of `module` return NaN."""
    calls = {"n": 0}

    def hook(mod: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor | None:
        if not mod.training:
            return None
        calls["n"] += 1
        return output * float("nan") if calls["n"] - 1 == micro_batch else None

    module.register_forward_hook(hook)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="trainguard-hf-")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=64,
                                       n_positions=32, bos_token_id=0, eos_token_id=0))
    language = MarkovLanguage(vocab_size=64, seed=0)
    data = [{"input_ids": ids, "labels": ids.clone()}
            for ids in language.batch(8 * args.steps * args.accumulate, 24)]
    if args.poison_step >= 0:
        poison_forward(model.transformer.wte, args.poison_step * args.accumulate)

    training = TrainingArguments(
        output_dir=f"{workdir}/trainer", per_device_train_batch_size=8, max_steps=args.steps,
        gradient_accumulation_steps=args.accumulate, learning_rate=3e-3, warmup_steps=5,
        logging_steps=10, save_strategy="no", report_to="none",
        use_cpu=not torch.cuda.is_available(), disable_tqdm=True, seed=0)
    callbacks = []
    if not args.no_guard:
        callbacks.append(TrainguardCallback(
            trainguard.GuardConfig(policy="protect",
                                   sinks={"console": True}), run_dir=f"{workdir}/run"))
    trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=callbacks)
    trainer.train()

    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    print(f"Trainer-logged losses: {[round(x, 3) for x in logged]} "
          f"(all finite: {all(math.isfinite(x) for x in logged)})")
    print(f"weights finite: {finite}")
    if callbacks:
        guard = callbacks[0]
        skipped = sorted({e.step for e in guard.events if e.kind == "nonfinite_loss"})
        print(f"trainguard skipped steps: {skipped}")
        print(f"run store: {workdir}/run (trainguard show {workdir}/run)")
    return 0 if finite or args.no_guard else 1


if __name__ == "__main__":
    raise SystemExit(main())
