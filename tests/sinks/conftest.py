"""A tiny guarded run for the sink tests: a real nn.Module, a real optimizer, a NaN step."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from trainguard import Guard, GuardConfig
from trainguard.events import StepReport
from trainguard.sinks import Sink


class TinyNet(nn.Module):
    """Parameters body.0.weight, body.0.bias, body.2.weight, body.2.bias."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@dataclass
class TinyRun:
    model: TinyNet
    optimizer: torch.optim.Optimizer
    guard: Guard
    reports: list[StepReport] = field(default_factory=list)
    _generator: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(0))

    def step(self, *, nan: bool = False) -> StepReport:
        x = torch.randn(16, 4, generator=self._generator)
        loss = nn.functional.mse_loss(self.model(x), x.sum(dim=1, keepdim=True))
        if nan:
            loss = loss * math.nan
        loss.backward()
        report = self.guard.step(loss)
        self.optimizer.zero_grad(set_to_none=True)
        self.reports.append(report)
        return report


def tiny_run(sinks: list[Sink], **config: object) -> TinyRun:
    """A guarded tiny regression (console off, sampled every 3 steps unless told)."""
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    settings: dict[str, object] = {"sinks": {"console": False}, "probes": {"sample_every": 3},
                                   **config}
    guard = Guard(model, optimizer, config=GuardConfig(**settings), sinks=sinks)
    return TinyRun(model, optimizer, guard)


def guarded_run(extra: list[Sink] | None = None, run_dir: Path | None = None,
                **sections: object) -> TinyRun:
    """`tiny_run` with a run store and any config section (`sinks` included) of the test's."""
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    settings: dict[str, object] = {"sinks": {"console": False}, "probes": {"sample_every": 3},
                                   **sections}
    guard = Guard(model, optimizer, config=GuardConfig(**settings), sinks=extra or [],
                  run_dir=run_dir)
    return TinyRun(model, optimizer, guard)


def run_steps(run: TinyRun, steps: int, nan_at: int | None = None,
              between: Callable[[int], None] | None = None) -> None:
    for step in range(steps):
        run.step(nan=step == nan_at)
        if between is not None:
            between(step)
