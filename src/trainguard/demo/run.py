"""`trainguard demo`: a healthy fine-tune and one that blows up, side by side, in under a minute.

Both runs train the same tiny causal transformer on the same synthetic language. The healthy run
uses AdamW at 3e-3 with warmup and cosine decay; the broken one uses a learning rate 300x higher
with no warmup, the guide's most common cause of a "rocket launch" (§3.1), under the `halt`
policy so that it stops with a crash snapshot.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch

from trainguard.config import GuardConfig, SinksConfig
from trainguard.demo.data import MarkovLanguage
from trainguard.demo.model import TinyCausalLM
from trainguard.errors import TrainingDiverged
from trainguard.events import Event, StepReport
from trainguard.guard import Guard
from trainguard.sinks import Sink


@dataclass(slots=True)
class DemoRun:
    name: str
    lr: float
    warmup: int
    policy: str


@dataclass(slots=True)
class DemoResult:
    name: str
    run_dir: str
    steps: int
    final_loss: float | None
    events: list[Event]
    actions: dict[str, int]
    halted: bool
    snapshot: str | None
    seconds: float


class ProgressSink(Sink):
    """A one-line progress bar; events are printed on their own lines as they happen."""

    def __init__(self, name: str, total: int, stream: TextIO) -> None:
        self.name = name
        self.total = total
        self.stream = stream
        self.tty = stream.isatty()
        self.last_print = -1

    def _clear(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")

    def on_event(self, event: Event) -> None:
        self._clear()
        self.stream.write(f"  ! {event}\n")
        self.stream.flush()

    def on_step(self, report: StepReport) -> None:
        done = report.step + 1
        if not self.tty and done % max(1, self.total // 5) and done != self.total:
            return
        width = 30
        filled = int(width * done / self.total)
        loss = "nan" if report.loss is None else f"{report.loss:8.4g}"
        line = (f"  {self.name:<8} [{'#' * filled}{'.' * (width - filled)}] {done:4d}/{self.total}"
                f"  loss {loss}  grad norm {report.grad_norm:9.4g}  {report.action:<8}")
        if self.tty:
            self._clear()
            self.stream.write(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def train(run: DemoRun, *, steps: int, out_dir: Path, seed: int, stream: TextIO) -> DemoResult:
    torch.manual_seed(seed)
    language = MarkovLanguage(seed=seed)
    model = TinyCausalLM(vocab_size=language.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=run.lr, weight_decay=0.01)

    def schedule(step: int) -> float:
        warm = min(1.0, (step + 1) / run.warmup) if run.warmup else 1.0
        return warm * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    run_dir = out_dir / run.name
    config = GuardConfig(policy=run.policy,  # type: ignore[arg-type]
                         sinks=SinksConfig(console=False))
    stream.write(f"\n{run.name}: AdamW lr {run.lr:g}, "
                 f"{f'{run.warmup} warmup steps' if run.warmup else 'no warmup'}, "
                 f"policy {run.policy}, run dir {run_dir}\n")
    started = time.perf_counter()
    last: StepReport | None = None
    snapshot = None
    halted = False
    with Guard(model, optimizer, scheduler, config=config, run_dir=run_dir,
               sinks=[ProgressSink(run.name, steps, stream)]) as guard:
        try:
            for _ in range(steps):
                batch = language.batch(16, 33)
                loss = model.loss(batch)
                loss.backward()
                last = guard.step(loss, batch={"input_ids": batch})
                optimizer.zero_grad(set_to_none=True)
        except TrainingDiverged as exc:
            halted = True
            snapshot = exc.snapshot_path
            last = exc.report
            stream.write(f"\n  halted: {exc}\n")
        events = list(guard.events)
    actions: dict[str, int] = {}
    # count what was done at each step from the store the run just wrote
    from trainguard.store import RunReader

    with RunReader(run_dir) as reader:
        for row in reader.steps():
            actions[row["action"]] = actions.get(row["action"], 0) + 1
    return DemoResult(name=run.name, run_dir=str(run_dir),
                      steps=(last.step + 1) if last else 0,
                      final_loss=last.loss if last else None, events=events, actions=actions,
                      halted=halted, snapshot=snapshot, seconds=time.perf_counter() - started)


def summary_table(results: list[DemoResult]) -> str:
    header = f"{'run':<10}{'steps':>6}{'final loss':>12}{'events':>8}  {'actions':<34}{'outcome'}"
    lines = [header, "-" * len(header)]
    for r in results:
        loss = "-" if r.final_loss is None else f"{r.final_loss:.4g}"
        actions = ", ".join(f"{k} {v}" for k, v in sorted(r.actions.items()))
        outcome = "halted, snapshot written" if r.halted else "finished"
        lines.append(f"{r.name:<10}{r.steps:>6}{loss:>12}{len(r.events):>8}  {actions:<34}"
                     f"{outcome}")
    return "\n".join(lines)


def run_demo(*, steps: int = 300, out_dir: str | Path = "trainguard-demo", seed: int = 0,
             stream: TextIO | None = None) -> list[DemoResult]:
    stream = stream or sys.stderr
    out = Path(out_dir)
    language = MarkovLanguage(seed=seed)
    stream.write("trainguard demo: a 2-layer causal transformer learns a synthetic language "
                 f"(chance loss {language.chance_loss:.2f}, best possible "
                 f"{language.entropy_floor:.2f})\n")
    runs = [DemoRun("healthy", lr=3e-3, warmup=30, policy="protect"),
            DemoRun("exploding", lr=1.0, warmup=0, policy="halt")]
    results = [train(run, steps=steps, out_dir=out, seed=seed, stream=stream) for run in runs]
    stream.write("\n" + summary_table(results) + "\n")
    for r in results:
        if r.snapshot:
            stream.write(f"\nCrash snapshot of '{r.name}': {r.snapshot}\n")
    stream.write(f"\nInspect a run with: trainguard show {results[-1].run_dir}\n")
    return results
