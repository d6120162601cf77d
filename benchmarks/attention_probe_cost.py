"""What the attention-logit probe costs on the GPT-2 workload of `benchmarks/overhead.py`.

    python -m benchmarks.attention_probe_cost [--rounds 15] [--steps 4] [--threads 1]

The workload's GPT-2 (6 layers, 384 wide, 6 heads, batch 8 x 128, AdamW) trains with SDPA
attention and with eager attention. Each round times a block of plain steps (forward, backward,
AdamW step, zero_grad) and a block of the same steps with `AttentionLogitProbe` attached before
the forward and detached after it (its hooks, its chunked logits on one sequence per layer, the
stack of its values; the pack's transfer is shared with the step's and not timed here). The
order of the two blocks alternates every round; then the probe's own arithmetic for the six
layers is timed alone (the best of 5). Reported: the median per-step time of each block, the
median over rounds of the paired ratio (probe block over plain block; on a shared machine its
spread is wider than the cost), and the median share of the plain step the arithmetic alone
took: the probe's cost on a step where it runs, every step at `detectors.attention_logits.every=1`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from trainguard.probes.attention_logits import AttentionLogitProbe, _split_heads, max_logit

from .overhead import build_workload


def _block(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: list,
           loss_fn, steps: int, probe: AttentionLogitProbe | None) -> float:
    started = time.perf_counter()
    for i in range(steps):
        if probe is not None:
            probe.attach()
        loss = loss_fn(model, batches[i % len(batches)])
        loss.backward()
        if probe is not None:
            probe.detach()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return (time.perf_counter() - started) / steps


def hook_work(shape: tuple[int, int, int], heads: int, reps: int = 5) -> float:
    """Seconds of the probe's own arithmetic for one step's 6 layers, timed alone (the best of
    `reps`): q and k of one sequence out of a c_attn output of `shape`, split into heads, the
    logits' max."""
    out = torch.randn(*shape)
    width = shape[-1] // 3
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        for _ in range(6):
            q, k = out[..., :width], out[..., width:2 * width]
            max_logit(_split_heads(q, width // heads), _split_heads(k, width // heads),
                      causal=True)
        best = min(best, time.perf_counter() - started)
    return best


def measure(attention: str, rounds: int, steps: int) -> dict[str, float]:
    workload = build_workload("gpt2", torch.device("cpu"))
    model = workload.model
    model.config._attn_implementation = attention  # the layers read it at each forward
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=workload.lr)
    probe = AttentionLogitProbe(model)
    assert len(probe.layers) == 6
    shape = (*workload.batches[0]["input_ids"].shape, 3 * 384)
    _block(model, optimizer, workload.batches, workload.compute_loss, 2, probe)  # warm-up
    plain, probed, ratios, alone = [], [], [], []
    for r in range(rounds):
        order = (None, probe) if r % 2 == 0 else (probe, None)
        times = {id(p): _block(model, optimizer, workload.batches, workload.compute_loss, steps,
                               p) for p in order}
        plain.append(times[id(None)])
        probed.append(times[id(probe)])
        ratios.append(probed[-1] / plain[-1])
        alone.append(hook_work(shape, 6) / plain[-1])
    quartiles = statistics.quantiles(ratios, n=4)
    share = statistics.quantiles(alone, n=4)
    return {"plain_ms": 1e3 * statistics.median(plain),
            "probe_ms": 1e3 * statistics.median(probed),
            "ratio": statistics.median(ratios), "ratio_p25": quartiles[0],
            "ratio_p75": quartiles[2], "alone": statistics.median(alone),
            "alone_p25": share[0], "alone_p75": share[2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for attention in ("sdpa", "eager"):
        m = measure(attention, args.rounds, args.steps)
        print(f"gpt2 {attention:<5}: step {m['plain_ms']:.1f} ms, with the probe "
              f"{m['probe_ms']:.1f} ms; paired ratio median {m['ratio']:.4f}x "
              f"(IQR {m['ratio_p25']:.4f}-{m['ratio_p75']:.4f}); the probe's arithmetic alone "
              f"{100 * m['alone']:.2f}% of the plain step (IQR {100 * m['alone_p25']:.2f}-"
              f"{100 * m['alone_p75']:.2f}%)")


if __name__ == "__main__":
    main()
