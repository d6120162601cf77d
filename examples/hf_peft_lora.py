"""trainguard with a PEFT LoRA model in a Hugging Face Trainer run.

    python examples/hf_peft_lora.py --steps 60 --poison-step 25

Only the adapter parameters are trained, so only they are watched, and every report names them
(`...c_attn.lora_A.default.weight`). A tiny GPT-2 is built from a config (nothing downloaded);
`--poison-step` makes one optimizer step's forward pass produce NaN, which trainguard skips.
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import trainguard
from trainguard.demo import MarkovLanguage
from trainguard.hf import TrainguardCallback


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps")
    parser.add_argument("--poison-step", type=int, default=25,
                        help="optimizer step whose forward pass yields NaN (-1: none)")
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
    workdir = args.workdir or tempfile.mkdtemp(prefix="trainguard-lora-")
    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=64,
                                      n_positions=32, bos_token_id=0, eos_token_id=0))
    model = get_peft_model(base, LoraConfig(
        r=8, lora_alpha=8, lora_dropout=0.0, target_modules=["c_attn", "c_fc"],
        fan_in_fan_out=True, task_type="CAUSAL_LM"))  # GPT-2's Conv1D layers are fan-in first
    language = MarkovLanguage(vocab_size=64, seed=0)
    data = [{"input_ids": ids, "labels": ids.clone()}
            for ids in language.batch(8 * args.steps, 24)]
    if args.poison_step >= 0:
        poison_forward(base.transformer.wte, args.poison_step)

    callback = TrainguardCallback(trainguard.GuardConfig(policy="protect", sinks={"console": True}),
                                  run_dir=f"{workdir}/run")
    training = TrainingArguments(
        output_dir=f"{workdir}/trainer", per_device_train_batch_size=8, max_steps=args.steps,
        learning_rate=5e-3, warmup_steps=5, logging_steps=10, save_strategy="no",
        report_to="none", use_cpu=not torch.cuda.is_available(), disable_tqdm=True, seed=0)
    Trainer(model=model, args=training, train_dataset=data, callbacks=[callback]).train()

    assert callback.run is not None
    watched = callback.run.watched.names
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    print(f"watched parameters ({len(watched)}, adapters only): {watched[:2]} ...")
    for event in callback.events:
        print(f"event {event.kind} at step {event.step}: {event.param}")
    print(f"weights finite: {finite}")
    print(f"run store: {workdir}/run (trainguard show {workdir}/run)")
    return 0 if finite and all("lora_" in name for name in watched) else 1


if __name__ == "__main__":
    raise SystemExit(main())
