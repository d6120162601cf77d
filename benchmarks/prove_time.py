"""Time of one proof by replay (`trainguard.diagnose.counterfactual`) per incident.

What it measures
    On the two workloads of `benchmarks/overhead.py` (gpt2: GPT2LMHeadModel n_layer=6 n_embd=384
    from its config, batch 8 x 128; mlp: Linear(512, 512) - ReLU - Linear(512, 10), batch 64), a
    Guard under `halt` with a `replay_fn` trains `--healthy` steps, then meets a real fault:

    lr      the loop raises the LR 1000x (the next update blows the loss up)
    outlier one batch 1000x its normal magnitude (mlp only: GPT-2's inputs are token ids)

    The Guard halts at the first error and proves the step first. Reported per workload and
    fault: the median training step time before the fault, the proofs' time and the replays they
    ran (each proof's plain replay and one per intervention tried; after the LR jump also the
    step replayed from the state copied before the jump's update, `diagnose/anchor.py`), their
    time in training steps, and what they confirmed; and the copy kept for the LR jump (its host
    memory, and the steps it was kept before the halt). Healthy steps pay nothing: the prover
    only keeps two floats and a reference a step, and a run whose LR never jumps copies nothing.

Usage
    python -m benchmarks.prove_time                      # both workloads, both faults
    python -m benchmarks.prove_time --workload mlp --threads 1
    python -m benchmarks.prove_time --device cuda
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


def measure(name: str, fault: str, healthy: int, device: str = "cpu") -> dict[str, Any]:
    workload = build_workload(name, torch.device(device))
    model = workload.model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=workload.lr)
    with tempfile.TemporaryDirectory() as snapshots:
        guard = Guard(model, optimizer, replay_fn=workload.compute_loss, config=GuardConfig(
            policy="halt", sinks={"console": False}, probes={"preflight": False},
            checkpoints={"snapshot_dir": snapshots}))
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
        anchor = guard.run.state.anchor
        kept = anchor.before_jump if anchor is not None else None
        guard.close()
    step_s = statistics.median(times[: healthy])
    copy = ({"copy_mb": kept.nbytes / 1e6, "kept_steps": guard.run.state.step - 1 - kept.step}
            if kept is not None else {"copy_mb": None, "kept_steps": None})
    if not proofs:
        return {"workload": name, "fault": fault, "step_ms": 1000 * step_s, "proof": None,
                **copy}
    at = [e.details for e in proofs if e.step == proofs[0].step]  # the halted step's proofs
    seconds = sum(p["seconds"] for p in at)
    return {"workload": name, "fault": fault, "step_ms": 1000 * step_s,
            "proof_s": seconds, "replays": sum(1 + len(p["trials"]) for p in at),
            "in_steps": seconds / step_s,
            "confirmed": sorted({c for p in at for c in p["confirmed"]}),
            "reproduced": any(p["reproduced"] for p in at), "step": proofs[0].step, **copy}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    parser.add_argument("--healthy", type=int, default=30, help="healthy steps before the fault")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    print(f"{'workload':<9}{'fault':<9}{'step ms':>9}{'proof s':>9}{'replays':>9}"
          f"{'in steps':>10}  confirmed (step); the copy kept for the LR jump")
    for name in names:
        for fault in FAULTS if name == "mlp" else FAULTS[:1]:
            r = measure(name, fault, args.healthy, args.device)
            copy = ("" if r["copy_mb"] is None else
                    f"; {r['copy_mb']:.1f} MB kept {r['kept_steps']} step(s)")
            if r.get("proof_s") is None:
                print(f"{name:<9}{fault:<9}{r['step_ms']:>9.1f}  no proof (no halt){copy}")
                continue
            print(f"{name:<9}{fault:<9}{r['step_ms']:>9.1f}{r['proof_s']:>9.2f}{r['replays']:>9}"
                  f"{r['in_steps']:>10.1f}  {', '.join(r['confirmed']) or '-'} (step {r['step']}"
                  f"{'' if r['reproduced'] else ', not reproducible'}){copy}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
