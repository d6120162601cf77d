"""Time each sink adds to a step on the training thread: TensorBoard, W&B and MLflow side by side
in one guarded run.

    python -m benchmarks.sink_cost [--steps 300] [--layers 6] [--sample-every 50]

One run of a `TinyCausalLM` (d_model 128, `--layers` blocks, about 12 parameter tensors a block)
guarded with `TensorBoardSink` (a temporary folder), `WandbSink` (an offline W&B run in a
temporary folder) and `MlflowSink` (a run of a local sqlite store in a temporary folder) at once.
Each sink is wrapped in a timer that adds up the time its calls take on the training thread
(`on_step`, `on_event`, `on_sampled`, ...); the close of each (which waits for what is queued)
is timed apart, as it is paid once. The figures are the mean and median per step of the steps
after the first 10 (the trackers' first calls open files and tables), in microseconds, and each
sink's mean over TensorBoard's (target: at most 1.0x). Needs the tensorboard, wandb and mlflow
extras; touches no network.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from trainguard import Guard, GuardConfig
from trainguard.demo import MarkovLanguage, TinyCausalLM
from trainguard.sinks import MlflowSink, Sink, TensorBoardSink, WandbSink
from trainguard.sinks.base import SINK_METHODS

WARMUP_STEPS = 10


class Timed(Sink):
    """Forwards every call to `inner` and adds up, per step, the time it takes here."""

    def __init__(self, inner: Sink) -> None:
        self.inner = inner
        self.per_step: list[float] = [0.0]
        self.closing = 0.0
        for name in SINK_METHODS:
            setattr(self, name, self._timed(name))

    def _timed(self, name: str) -> Any:
        call = getattr(self.inner, name)

        def timed(*args: Any) -> None:
            start = time.perf_counter()
            call(*args)
            spent = time.perf_counter() - start
            if name == "close":
                self.closing += spent
                return
            self.per_step[-1] += spent
            if name == "on_step":  # the step's calls end with on_step
                self.per_step.append(0.0)
        return timed


def _sinks(tmp: Path) -> dict[str, Sink]:
    import mlflow
    import wandb

    run = wandb.init(mode="offline", dir=str(tmp), project="trainguard-sink-cost",
                     settings=wandb.Settings(silent=True, console="off"))
    client = mlflow.MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    experiment = client.create_experiment("sink-cost",
                                          artifact_location=(tmp / "artifacts").as_uri())
    mlflow_run = client.create_run(experiment)
    return {"TensorBoardSink": TensorBoardSink(tmp / "tb"),
            "WandbSink": WandbSink(run),
            "MlflowSink": MlflowSink(mlflow_run.info.run_id, client=client)}


def measure(steps: int, layers: int, sample_every: int) -> dict[str, Timed]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    language = MarkovLanguage(vocab_size=64, seed=0)
    model = TinyCausalLM(vocab_size=64, d_model=128, n_layer=layers, n_head=4, max_len=64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    with tempfile.TemporaryDirectory(prefix="trainguard-sink-cost-") as folder:
        timed = {name: Timed(sink) for name, sink in _sinks(Path(folder)).items()}
        guard = Guard(model, optimizer, sinks=list(timed.values()),
                      config=GuardConfig(sinks={"console": False, "trackers": False},
                                         probes={"sample_every": sample_every}))
        for _ in range(steps):
            batch = language.batch(8, 64)
            loss = model.loss(batch)
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad(set_to_none=True)
        guard.close()
        import wandb

        if wandb.run is not None:
            wandb.run.finish()
    return timed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--sample-every", type=int, default=50)
    args = parser.parse_args(argv)
    os.environ.setdefault("WANDB_SILENT", "true")
    timed = measure(args.steps, args.layers, args.sample_every)
    reference = statistics.fmean(timed["TensorBoardSink"].per_step[WARMUP_STEPS:-1])
    print(f"{args.steps} steps, {args.layers} blocks, sampled every {args.sample_every} steps; "
          "time on the training thread, per step (us)")
    print(f"{'sink':<16}{'mean':>10}{'median':>10}{'max':>10}{'vs TB':>8}{'close (s)':>11}")
    for name, sink in timed.items():
        spent = [s * 1e6 for s in sink.per_step[WARMUP_STEPS:-1]]
        mean = statistics.fmean(spent)
        print(f"{name:<16}{mean:>10.1f}{statistics.median(spent):>10.1f}{max(spent):>10.1f}"
              f"{mean / (reference * 1e6):>7.2f}x{sink.closing:>11.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
