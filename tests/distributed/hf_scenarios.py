"""Rank scenarios with a real Hugging Face Trainer on two gloo ranks (DDP on the CPU)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from transformers import Trainer, TrainingArguments

from tests.integrations.test_hf import tiny_gpt2, token_data
from trainguard import GuardConfig
from trainguard.hf import TrainguardCallback


def _trainer(rank: int, world: int, out: str, callbacks: list[Any], steps: int,
             **options: Any) -> Trainer:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)})
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=steps,
                             learning_rate=1e-3, report_to="none", save_strategy="no",
                             logging_steps=1, use_cpu=True, disable_tqdm=True, seed=0,
                             ddp_backend="gloo", **options)
    return Trainer(model=tiny_gpt2(), args=args, train_dataset=token_data(),
                   callbacks=callbacks)


def callback_on_rank0_only(rank: int, world: int, out: str, timeout_s: float) -> dict[str, Any]:
    """The usual pattern for loggers, `if rank == 0: callbacks.append(...)`, with trainguard."""
    callbacks = ([TrainguardCallback(GuardConfig(sinks={"console": False},
                                                 distributed={"rank_timeout_s": timeout_s}))]
                 if rank == 0 else [])
    trainer = _trainer(rank, world, out, callbacks, steps=4)
    started = time.monotonic()
    try:
        trainer.train()
    except Exception as exc:
        raise RuntimeError(f"after {time.monotonic() - started:.1f} s: {exc}") from None
    return {"finished": True}


def callback_on_every_rank(rank: int, world: int, out: str, policy: str) -> dict[str, Any]:
    callback = TrainguardCallback(GuardConfig(policy=policy,
                                              sinks={"console": False}))  # type: ignore[arg-type]
    trainer = _trainer(rank, world, out, [callback], steps=4)
    trainer.train()
    assert callback.run is not None
    return {"steps": callback.run.state.step, "world": callback.run.dist.world_size
            if callback.run.dist is not None else 1}


def different_configs(rank: int, world: int, out: str) -> dict[str, Any]:
    policy = "protect" if rank == 0 else "recover"
    callback = TrainguardCallback(GuardConfig(policy=policy,  # type: ignore[arg-type]
                                              sinks={"console": False},
                                              distributed={"rank_timeout_s": 20}))
    trainer = _trainer(rank, world, out, [callback], steps=4)
    trainer.train()
    return {"finished": True}


def fsdp_asked_for(rank: int, world: int, out: str) -> dict[str, Any]:
    """`fsdp="full_shard"` in the arguments, on CPU ranks: what the Trainer really wraps
    decides whether the callback can guard it."""
    callback = TrainguardCallback(GuardConfig(sinks={"console": False}))
    trainer = _trainer(rank, world, out, [callback], steps=3, fsdp="full_shard")
    try:
        trainer.train()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}",
                "wrapped": type(trainer.model_wrapped).__name__}
    return {"steps": callback.run.state.step if callback.run else None,
            "wrapped": type(trainer.model_wrapped).__name__}


def sharding_checks(rank: int, world: int) -> dict[str, Any]:
    """The callback's check on the wrapper itself: an FSDP2 model (DTensor parameters) passes.
    (FSDP1 cannot be built without an accelerator, so its refusal is not exercised here.)"""
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    from trainguard.integrations.hf import check_sharding

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    fully_shard(model)
    check_sharding(model, torch.optim.AdamW(model.parameters()))
    return {"fsdp2": "accepted",
            "dtensor": type(next(model.parameters())).__name__}


def nan_burst_under_recover(rank: int, world: int, out: str, burst: tuple[int, ...]
                            ) -> dict[str, Any]:
    """Rank 1's forward turns NaN on the optimizer steps in `burst`, under `recover` with its
    default good-state cadence."""
    callback = TrainguardCallback(GuardConfig(policy="recover", sinks={"console": False}))
    trainer = _trainer(rank, world, out, [callback], steps=40)
    calls = {"n": 0}

    def poison(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor | None:
        if not module.training:
            return None
        index, calls["n"] = calls["n"], calls["n"] + 1
        return output * float("nan") if rank == 1 and index in burst else None

    trainer.model.transformer.wte.register_forward_hook(poison)
    trainer.train()
    events = [(e.kind, e.step, e.details.get("steps_undone"), e.details.get("ranks"))
              for e in callback.events if e.kind in ("rollback", "nonfinite_loss")]
    weights = [float(p.detach().double().sum()) for p in trainer.model.parameters()]
    return {"events": events, "weights": weights}
