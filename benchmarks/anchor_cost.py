"""Cost of one proof anchor: a host copy of the model and optimizer state, against a step.

A window replay needs a good state to start from; under `recover` the ring keeps them. Under
`halt` and `observe` an anchor (one copy refreshed every N steps) would give the prover one too.
This times what the ring's capture (`recovery.state.capture`) costs on the `overhead.py` GPT-2
(n_layer=6, n_embd=384, vocab 8192, AdamW after one step, batch 8 x 128 tokens) against one
training step, and the host memory the copy takes.

Usage
    python -m benchmarks.anchor_cost [--repeats 5]
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
    args = parser.parse_args()
    torch.manual_seed(0)
    model, opt = build("bench", "cpu")
    tokens = torch.randint(0, 8192, (8, 128))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(tokens, labels=tokens).loss.backward()
        opt.step()

    step()  # every moment exists
    steps: list[float] = []
    captures: list[float] = []
    state: SavedState | None = None
    for _ in range(args.repeats):
        started = time.perf_counter()
        step()
        steps.append(time.perf_counter() - started)
        started = time.perf_counter()
        state = capture(step=0, model=model, optimizers=[opt], scheduler=None, scaler=None,
                        guard_state={}, reuse=state)
        captures.append(time.perf_counter() - started)
    assert state is not None
    step_s, capture_s = statistics.median(steps), statistics.median(captures)
    params = sum(p.numel() for p in model.parameters())
    print(f"parameters {params / 1e6:.1f}M  step {step_s * 1000:.0f} ms  capture "
          f"{capture_s * 1000:.1f} ms  capture/step {capture_s / step_s:.1%}  host "
          f"{state.nbytes / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
