"""Cost of the finiteness check at a checkpoint against the save itself, on GPT-2.

What it measures
    A GPT-2 built from its config (never downloaded; `--size small`: the 124M-parameter GPT-2,
    `--size bench`: the n_layer=6, n_embd=384, vocab 8192 model of `benchmarks/overhead.py`)
    with AdamW after one step, so that every moment exists. Timed:

    - check: `trainguard.checkpoint_health.finite_state(model.parameters(), optimizer)`, the
      finiteness check `mark_checkpoint` runs (on the model's device, one host transfer);
    - save: what the Hugging Face Trainer writes for a checkpoint's model and optimizer:
      `model.save_pretrained(folder)` (safetensors) and `torch.save(optimizer.state_dict())`,
      into a fresh folder each time (the files removed between repetitions).

    Reported: the median of each over the repetitions, and check / save in percent.

Usage
    python benchmarks/checkpoint_cost.py                       # CPU, GPT-2 small
    python benchmarks/checkpoint_cost.py --device cuda --repeats 10 --json out.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def build(size: str, device: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = (GPT2Config() if size == "small" else
              GPT2Config(n_layer=6, n_embd=384, n_head=6, vocab_size=8192, n_positions=128))
    model = GPT2LMHeadModel(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (2, 64), device=device)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_check(model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: str,
               repeats: int) -> list[float]:
    from trainguard.checkpoint_health import finite_state

    assert finite_state(model.parameters(), optimizer) == (True, True)  # warm-up, and a check
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        finite_state(model.parameters(), optimizer)  # ends with its host transfer (a sync)
        times.append(time.perf_counter() - start)
    return times


def time_save(model: Any, optimizer: torch.optim.Optimizer, device: str,
              repeats: int) -> list[float]:
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(repeats):
            folder = Path(tmp) / f"checkpoint-{index}"
            _sync(device)
            start = time.perf_counter()
            model.save_pretrained(folder)
            torch.save(optimizer.state_dict(), folder / "optimizer.pt")
            times.append(time.perf_counter() - start)
            shutil.rmtree(folder)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", choices=("small", "bench"), default="small")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    model, optimizer = build(args.size, args.device)
    params = sum(p.numel() for p in model.parameters())
    check = statistics.median(time_check(model, optimizer, args.device, args.repeats * 4))
    save = statistics.median(time_save(model, optimizer, args.device, args.repeats))
    result = {"device": args.device, "size": args.size, "parameters": params,
              "check_ms": round(check * 1e3, 3), "save_ms": round(save * 1e3, 1),
              "check_percent_of_save": round(100 * check / save, 3)}
    print(f"GPT-2 {args.size} ({params / 1e6:.1f}M parameters) on {args.device}: finiteness "
          f"check {result['check_ms']} ms, save {result['save_ms']} ms: "
          f"{result['check_percent_of_save']}% of the save")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
