"""trainguard in a Lightning run: one callback, and its state carried through a checkpoint.

    python examples/lightning_loop.py --steps 60 --poison-step 20

A tiny causal language model learns a synthetic Markov language under a Lightning Trainer
(`lightning.pytorch`, or `pytorch_lightning` when that is what is installed). One step's loss is
made NaN: trainguard skips it and rewinds the step-interval LR schedule. The run then stops, is
checkpointed, and a new Trainer resumes from the checkpoint with the guard's baselines intact.
"""

from __future__ import annotations

import argparse
import importlib
import math
import tempfile
from pathlib import Path
from typing import Any

import torch

import trainguard
from trainguard.demo import MarkovLanguage, TinyCausalLM
from trainguard.lightning import NAMESPACES, TrainguardCallback

pl = importlib.import_module(NAMESPACES[0])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps in all")
    parser.add_argument("--poison-step", type=int, default=20,
                        help="optimizer step whose loss becomes NaN (-1: none)")
    parser.add_argument("--workdir", default=None,
                        help="checkpoints and trainguard run stores (default: a temporary dir)")
    return parser.parse_args(argv)


class LanguageModel(pl.LightningModule):
    def __init__(self, total_steps: int, poison_step: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = TinyCausalLM(vocab_size=64, d_model=64, n_layer=2, n_head=4, max_len=32)
        self.total_steps = total_steps
        self.poison_step = poison_step

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.model.loss(batch)
        if self.global_step == self.poison_step:
            loss = loss * float("nan")  # what an overflow deep in the model would produce
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3, weight_decay=0.01)
        warmup, total = 10, self.total_steps

        def schedule(step: int) -> float:
            return min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / total))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def trainer(max_steps: int, workdir: Path, callback: TrainguardCallback) -> Any:
    return pl.Trainer(max_steps=max_steps, accelerator="auto", devices=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, gradient_clip_val=1.0,
                      default_root_dir=str(workdir), callbacks=[callback])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="trainguard-lightning-"))
    half = args.steps // 2
    language = MarkovLanguage(vocab_size=64, seed=0)
    batches = [language.batch(8, 17) for _ in range(half)]  # an epoch ends at the checkpoint
    loader = torch.utils.data.DataLoader(batches, batch_size=None)  # items are whole batches
    config = trainguard.GuardConfig(policy="protect", sinks={"console": True})

    first = TrainguardCallback(config, run_dir=workdir / "run-part1")
    run = trainer(half, workdir, first)
    run.fit(LanguageModel(args.steps, args.poison_step), loader)
    run.save_checkpoint(workdir / "half.ckpt")
    print(f"part 1 ({pl.__name__}): {half} steps, events "
          f"{[f'{e.kind}@{e.step}' for e in first.events]}")

    second = TrainguardCallback(config, run_dir=workdir / "run-part2")
    module = LanguageModel(args.steps, args.poison_step)
    trainer(args.steps, workdir, second).fit(module, loader, ckpt_path=workdir / "half.ckpt")
    resumed = second.state_dict()
    carried = resumed["detectors"]["loss_spike"]["baseline"]["values"]
    finite = all(bool(torch.isfinite(p).all()) for p in module.parameters())
    print(f"part 2: resumed at step {half} with the guard's loss baseline of "
          f"{len(first.state_dict()['detectors']['loss_spike']['baseline']['values'])} steps; "
          f"now {len(carried)} steps, last loss "
          f"{second.last_report.loss if second.last_report else float('nan'):.3f}")
    print(f"weights finite: {finite}")
    return 0 if finite and resumed["step"] == args.steps else 1


if __name__ == "__main__":
    raise SystemExit(main())
