"""Time of one proof by replay (`trainguard.diagnose.counterfactual`) per incident.

What it measures
    On the two workloads of `benchmarks/overhead.py` (gpt2: GPT2LMHeadModel n_layer=6 n_embd=384
    from its config, batch 8 x 128; mlp: Linear(512, 512) - ReLU - Linear(512, 10), batch 64), a
    Guard under `halt` with a `replay_fn` trains `--healthy` steps, then meets a real fault:

    lr      the loop raises the LR 1000x (the next update blows the loss up)
    outlier one batch 1000x its normal magnitude (mlp only: GPT-2's inputs are token ids)

    The Guard halts at the first error and proves the step first. Reported per workload and
    fault: the median training step time before the fault, the proof's time and the replays it
    ran (the plain replay and one per intervention tried), the proof's time in training steps,
    and what it confirmed. Healthy steps pay nothing: the prover only keeps two floats and a
    reference a step.

Usage
    python -m benchmarks.prove_time                      # both workloads, both faults
    python -m benchmarks.prove_time --workload mlp --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import torch

from trainguard import Guard, GuardConfig, TrainingDiverged

from .overhead import WORKLOADS, build_workload

FAULTS = ("lr", "outlier")


def _faulty(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch 1000x its normal magnitude (float inputs only: token ids have no magnitude)."""
    return {**batch, "x": batch["x"] * 1000}


def measure(name: str, fault: str, healthy: int) -> dict[str, Any]:
    workload = build_workload(name, torch.device("cpu"))
    model = workload.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=workload.lr)
    with tempfile.TemporaryDirectory() as snapshots:
        guard = Guard(model, optimizer, replay_fn=workload.compute_loss, config=GuardConfig(
            policy="halt", console=False, preflight=False, snapshot_dir=snapshots))
        times: list[float] = []
        try:
            for step in range(healthy + 20):
                started = time.perf_counter()
                batch = workload.batches[step % len(workload.batches)]
                if step == healthy and fault == "lr":
                    for group in optimizer.param_groups:
                        group["lr"] *= 1000
                if step == healthy and fault == "outlier":
                    batch = _faulty(batch)
                loss = workload.compute_loss(model, batch)
                loss.backward()
                guard.step(loss, batch=batch)
                optimizer.zero_grad(set_to_none=True)
                times.append(time.perf_counter() - started)
        except TrainingDiverged:
            pass
        proofs = [e for e in guard.events if e.kind == "proof"]
        guard.close()
    step_s = statistics.median(times[: healthy])
    if not proofs:
        return {"workload": name, "fault": fault, "step_ms": 1000 * step_s, "proof": None}
    proof = proofs[0].details
    return {"workload": name, "fault": fault, "step_ms": 1000 * step_s,
            "proof_s": proof["seconds"], "replays": 1 + len(proof["trials"]),
            "in_steps": proof["seconds"] / step_s, "confirmed": sorted(proof["confirmed"]),
            "reproduced": proof["reproduced"], "step": proofs[0].step}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    parser.add_argument("--healthy", type=int, default=30, help="healthy steps before the fault")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    print(f"{'workload':<9}{'fault':<9}{'step ms':>9}{'proof s':>9}{'replays':>9}"
          f"{'in steps':>10}  confirmed (step)")
    for name in names:
        for fault in FAULTS if name == "mlp" else FAULTS[:1]:
            r = measure(name, fault, args.healthy)
            if r.get("proof_s") is None:
                print(f"{name:<9}{fault:<9}{r['step_ms']:>9.1f}  no proof (no halt)")
                continue
            print(f"{name:<9}{fault:<9}{r['step_ms']:>9.1f}{r['proof_s']:>9.2f}{r['replays']:>9}"
                  f"{r['in_steps']:>10.1f}  {', '.join(r['confirmed']) or '-'} (step {r['step']}"
                  f"{'' if r['reproduced'] else ', not reproducible'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
