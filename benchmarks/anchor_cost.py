"""Cost of the proof anchor's copies: a host copy of the model and optimizer state, against a step.

A proof that replays from before the damage needs a state from then. Under `recover` the ring
keeps them; without one the proof anchor (`diagnose/anchor.py`) keeps its own: under
`prove="on"` good states at the ring's cadence, and otherwise (`prove="auto"`, halt and protect)
one copy taken before the update of a step whose LR the loop raised 10x or more. This times the
copy (`recovery.state.capture`, as the anchor takes it: no RNG state) on the `overhead.py` GPT-2
(n_layer=6, n_embd=384, vocab 8192, AdamW after one step, batch 8 x 128 tokens) against one
training step, and the host memory it holds. The first copy allocates its host buffers (pinned on
CUDA), as an LR jump's copy does; the later ones reuse them, as the ring's cadence does. On CUDA
each copy is timed to its end (the copies are queued and complete at the next transfer).

Usage
    python -m benchmarks.anchor_cost [--repeats 5] [--device cuda]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.checkpoint_cost import build
from trainguard.recovery.state import SavedState, capture


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = args.device
    model, opt = build("bench", device)
    tokens = torch.randint(0, 8192, (8, 128), device=device)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(tokens, labels=tokens).loss.backward()
        opt.step()

    def copy(reuse: SavedState | None) -> tuple[SavedState, float]:
        sync()
        started = time.perf_counter()
        state = capture(step=0, model=model, optimizers=[opt], scheduler=None, scaler=None,
                        guard_state={}, rng=False, reuse=reuse)
        sync()
        return state, time.perf_counter() - started

    step()  # every moment exists
    steps: list[float] = []
    fresh: list[float] = []
    reused: list[float] = []
    state, _ = copy(None)  # the buffers the reusing copies write into
    for _ in range(args.repeats):
        sync()
        started = time.perf_counter()
        step()
        sync()
        steps.append(time.perf_counter() - started)
        fresh.append(copy(None)[1])
        state, seconds = copy(state)
        reused.append(seconds)
    step_s = statistics.median(steps)
    fresh_s, reused_s = statistics.median(fresh), statistics.median(reused)
    params = sum(p.numel() for p in model.parameters())
    print(f"{device}: parameters {params / 1e6:.1f}M  step {step_s * 1000:.1f} ms  "
          f"copy into new buffers {fresh_s * 1000:.1f} ms ({fresh_s / step_s:.1%} of a step)  "
          f"into reused ones {reused_s * 1000:.1f} ms ({reused_s / step_s:.1%})  host "
          f"{state.nbytes / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
