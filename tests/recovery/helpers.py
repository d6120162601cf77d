"""A small regression workload with dropout (so RNG matters) and a deterministic data stream."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

import trainguard
from trainguard import Guard, GuardConfig, RecoveryConfig


@dataclass
class Workload:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    target: torch.Tensor

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(32, 8, generator=gen)
        return {"x": x, "y": x @ self.target}

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return nn.functional.mse_loss(self.model(batch["x"]), batch["y"])


def make_workload(lr: float = 1e-2, seed: int = 0) -> Workload:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10))
    return Workload(model, optimizer, scheduler, torch.randn(8, 1))


def recover_guard(w: Workload, *, clip: float | str | None = "auto",
                  **recovery: object) -> Guard:
    # a fixed cadence (every 10 steps): these tests check exact rollback targets
    settings = {"ring_every": 10, "confirm_steps": 2, "ring_budget": None, **recovery}
    config = GuardConfig(policy="recover", recovery=RecoveryConfig(**settings),
                         sinks={"console": False}, clip={"max_grad_norm": clip})  # type: ignore[arg-type]
    return Guard(w.model, w.optimizer, w.scheduler, config=config)


def run(guard: Guard, w: Workload, steps: range, *, scale: dict[int, float] | None = None,
        loss_scale: dict[int, float] | None = None,
        data_ids: bool = False) -> list[trainguard.StepReport]:
    """One step per index; `scale` multiplies the targets of some steps (a poisoned batch),
    `loss_scale` their loss (a fault of the computation: the batch itself is clean)."""
    reports = []
    for step in steps:
        batch = w.batch(step)
        if scale and step in scale:
            batch = {"x": batch["x"], "y": batch["y"] * scale[step]}
        loss = w.loss(batch)
        if loss_scale and step in loss_scale:
            loss = loss * loss_scale[step]
        loss.backward()
        reports.append(guard.step(loss, batch=batch, data_ids=step if data_ids else None))
        w.optimizer.zero_grad(set_to_none=True)
    return reports
