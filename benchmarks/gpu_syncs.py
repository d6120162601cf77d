"""Count the device-to-host synchronisations of one guarded optimizer step, on CUDA.

    python benchmarks/gpu_syncs.py            # prints one table; exits 0 without CUDA, saying so

A guarded step must synchronise once (its one packed transfer, `trainguard.transfer.to_host`).
`torch.cuda.set_sync_debug_mode("warn")` makes PyTorch warn at every synchronising call; the
script counts those warnings over steady-state steps of a small GPT-2 built from its config, for
the baseline loop, `clip_grad_norm_`, the default Guard, the Guard with every probe on every step
and the Guard under the recover policy (whose good-state copies are pinned and asynchronous), and,
with AdamW(fused=True), the baseline loop and the Guard under `sync="deferred"`, which must not
synchronise at all in steady state (its summary crosses in a non-blocking copy to pinned memory,
read a step later); prints syncs per step side by side with trainguard's own transfer counts
(all, and those that block).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable

import torch

STEPS = 20
WARMUP = 5


FUSED = ("baseline_fused", "guard_deferred")
"""Variants trained with AdamW(fused=True)."""


def build(fused: bool = False,
          ) -> tuple[torch.nn.Module, torch.optim.Optimizer, Callable[[], torch.Tensor]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=8192,
                                       n_positions=128)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if fused else None)
    ids = torch.randint(0, 8192, (8, 128), device="cuda")
    return model, optimizer, lambda: model(input_ids=ids, labels=ids).loss


def count(variant: str) -> tuple[float, float, float]:
    """(syncs, trainguard transfers, of which blocking) per step over STEPS steady steps."""
    import trainguard
    from trainguard.transfer import blocking_transfer_count, transfer_count

    model, optimizer, loss_fn = build(fused=variant in FUSED)
    guard = None
    if variant not in ("baseline", "clip_grad_norm_", "baseline_fused"):
        config = {"guard_default": trainguard.GuardConfig(sinks={"console": False}),
                  "guard_all_probes": trainguard.GuardConfig(sinks={"console": False},
                                                             probes={"sample_all_steps": True}),
                  "guard_recover": trainguard.GuardConfig(policy="recover",
                                                          sinks={"console": False}),
                  "guard_deferred": trainguard.GuardConfig(sync="deferred",
                                                           sinks={"console": False})}
        guard = trainguard.Guard(model, optimizer, config=config[variant])

    def step() -> None:
        loss = loss_fn()
        loss.backward()
        if guard is not None:
            guard.step(loss)
        else:
            if variant == "clip_grad_norm_":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    before, blocked = transfer_count(), blocking_transfer_count()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(STEPS):
                step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = sum(1 for w in caught if "synchroniz" in str(w.message).lower())
    transfers, blocking = transfer_count() - before, blocking_transfer_count() - blocked
    if guard is not None:
        guard.close()
    return syncs / STEPS, transfers / STEPS, blocking / STEPS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_syncs: no CUDA device here; nothing to count (run it on a GPU machine)")
        return 0
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'variant':<18} {'syncs/step':>10} {'trainguard transfers/step':>26} "
          f"{'of which blocking':>18}")
    for variant in ("baseline", "clip_grad_norm_", "guard_default", "guard_all_probes",
                    "guard_recover", "baseline_fused", "guard_deferred"):
        syncs, transfers, blocking = count(variant)
        print(f"{variant:<18} {syncs:>10.2f} {transfers:>26.2f} {blocking:>18.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
