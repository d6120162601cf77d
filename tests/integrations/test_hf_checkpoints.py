"""Checkpoints of a real `transformers.Trainer` run (tiny GPT-2 from its config, save_steps=10,
save_total_limit=2) whose loss goes NaN at step 35 and stays NaN: without trainguard only NaN
checkpoints are left; with the callback under observe the step-30 checkpoint survives marked
healthy and the NaN ones are marked poisoned; under protect none is poisoned; a resume from
`last_healthy_checkpoint` with the bad data still there ends where the healthy run ends.

The bad data: records that start with token 63 (never drawn otherwise); the model's embedding
output goes NaN on a batch holding one, as a corrupt record that overflows would make it."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

import trainguard
from trainguard import GuardConfig
from trainguard.checkpoints import SIDECAR, STATE_FILE, list_checkpoints
from trainguard.hf import TrainguardCallback
from trainguard.report import build_report
from trainguard.vocabulary import HIDDEN_LOSS

from ..conftest import Actions
from ..report.helpers import payload

BATCH, STEPS, BAD_STEPS, MARK = 4, 60, range(35, 38), 63


class Records(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, bad: bool) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, MARK, (STEPS * BATCH, 16), generator=generator)
        self.ids[:, 1::2] = (self.ids[:, 0::2] + 1) % MARK  # a pattern to learn
        if bad:
            for step in BAD_STEPS:
                self.ids[step * BATCH, 0] = MARK

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index].clone()}


def _nan_on_bad_records(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor
                        ) -> torch.Tensor:
    bad = (args[0][:, 0] == MARK).any()
    return output * torch.where(bad, float("nan"), 1.0)


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=64,
                                       n_positions=32))
    model.transformer.wte.register_forward_hook(_nan_on_bad_records)
    return model


def train(out: Path, callback: TrainguardCallback | None, *, bad: bool = True,
          resume: Path | None = None) -> Trainer:
    args = TrainingArguments(
        output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=BATCH, save_steps=10,
        save_total_limit=2, logging_steps=5, learning_rate=1e-3, report_to="none", use_cpu=True,
        disable_tqdm=True, seed=0, train_sampling_strategy="sequential")
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=Records(bad),
                      callbacks=[callback] if callback is not None else [])
    trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)
    return trainer


def finite_weights(folder: Path) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in load_file(folder / "model.safetensors")
               .values())


def eval_loss(model: nn.Module) -> float:
    ids = Records(bad=False).ids[:64]
    model.eval()
    with torch.no_grad():
        return float(model(input_ids=ids, labels=ids).loss)


def test_without_trainguard_only_nan_checkpoints_are_left(tmp_path: Path) -> None:
    train(tmp_path, None)
    kept = sorted(p.name for p in tmp_path.glob("checkpoint-*"))
    assert kept == ["checkpoint-50", "checkpoint-60"]
    assert not any(finite_weights(tmp_path / name) for name in kept)


def test_observe_keeps_the_last_healthy_checkpoint_and_marks_the_nan_ones(
        tmp_path: Path) -> None:
    actions = Actions()
    callback = TrainguardCallback(GuardConfig(policy="observe", sinks={"console": False}),
                                  run_dir=tmp_path / "run", sinks=[actions])
    trainer = train(tmp_path, callback)
    statuses = {e.path.name: e.status for e in list_checkpoints(tmp_path)}
    assert statuses == {"checkpoint-30": "healthy", "checkpoint-60": "poisoned"}
    assert finite_weights(tmp_path / "checkpoint-30")
    assert not finite_weights(tmp_path / "checkpoint-60")  # observe changed nothing in training
    assert trainguard.last_healthy_checkpoint(tmp_path) == tmp_path / "checkpoint-30"
    assert (tmp_path / "checkpoint-30" / STATE_FILE).is_file()
    sidecar = json.loads((tmp_path / "checkpoint-60" / SIDECAR).read_text())
    assert sidecar["step"] == 60 and sidecar["weights_finite"] is False
    kept = [a for a in actions.actions if a.kind == "checkpoint_kept"]
    assert len(kept) == 1 and "checkpoint-30" in kept[0].message
    assert trainer.state.best_model_checkpoint == str(tmp_path / "checkpoint-30")
    assert [e.step for e in callback.events if e.kind == "poisoned_checkpoint"] == [40, 50, 60]
    # the Trainer's log hides the NaN loss (logging_nan_inf_filter); the event says so
    hidden = [e for e in callback.events if e.kind == "nonfinite_loss"]
    assert hidden and all(e.details.get(HIDDEN_LOSS) for e in hidden)
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert all(math.isfinite(v) for v in logged)
    # ... and the report marks those steps on the loss plot
    loss = next(f for f in payload(build_report(tmp_path / "run")[0])["figures"]
                if f["id"] == "loss")
    assert f"{len(hidden)} steps hidden from the trainer's logged loss" in (
        loss["layout"]["title"]["text"])
    marked = [t for t in loss["data"] if "loss hidden from the trainer" in t.get("name", "")]
    assert len(marked) == 1 and marked[0]["x"] == [e.step for e in hidden]


def test_protect_poisons_no_checkpoint(tmp_path: Path) -> None:
    callback = TrainguardCallback(GuardConfig(policy="protect", sinks={"console": False}))
    train(tmp_path, callback)
    entries = list_checkpoints(tmp_path)
    assert [e.path.name for e in entries] == ["checkpoint-50", "checkpoint-60"]
    assert all(e.status == "healthy" for e in entries)
    assert all(finite_weights(e.path) for e in entries)


def test_a_blocked_poisoned_checkpoint_is_never_the_trainers_last(tmp_path: Path) -> None:
    config = GuardConfig(policy="observe", sinks={"console": False},
                         checkpoints={"block_poisoned": True})
    train(tmp_path, TrainguardCallback(config))
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [
        "checkpoint-30", "checkpoint-60.poisoned"]
    assert get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-30")
    entries = {e.path.name: e.status for e in list_checkpoints(tmp_path)}
    assert entries == {"checkpoint-30": "healthy", "checkpoint-60.poisoned": "poisoned"}


def test_a_resume_from_the_last_healthy_checkpoint_ends_as_the_healthy_run(
        tmp_path: Path) -> None:
    healthy = train(tmp_path / "healthy", None, bad=False)
    first = TrainguardCallback(GuardConfig(policy="observe", sinks={"console": False}))
    train(tmp_path / "broken", first)
    start = trainguard.last_healthy_checkpoint(tmp_path / "broken")
    assert start is not None and start.name == "checkpoint-30"
    # a resume comes later than the run it resumes: the Trainer's rotation orders the checkpoint
    # folders by their time (by step number only when all fall within one second, as they do in
    # a test run, and the abandoned run's checkpoint-60 would then outrank the new ones); the
    # folders are dated a minute back, their files (which the sidecars describe) left as they are
    past = time.time() - 60
    for folder in (tmp_path / "broken").glob("checkpoint-*"):
        os.utime(folder, (past, past))

    actions = Actions()
    callback = TrainguardCallback(GuardConfig(policy="protect", sinks={"console": False}),
                                  sinks=[actions])
    resumed = train(tmp_path / "broken", callback, resume=start)  # the bad data is still there
    # checkpoint-40 came inside the incident of steps 35-37: checkpoint-30 was kept meanwhile
    kept = [a.details["kept"] for a in actions.actions if a.kind == "checkpoint_kept"]
    assert kept == [str(start)]
    assert [(e.path.name, e.status) for e in list_checkpoints(tmp_path / "broken")] == [
        ("checkpoint-50", "healthy"), ("checkpoint-60", "healthy")]
    assert callback.run is not None and callback.run.state.step == STEPS
    bad = sorted({e.step for e in callback.events if e.kind.startswith("nonfinite")})
    assert bad == list(BAD_STEPS)  # skipped where the bad records are, no relapse after
    assert all(bool(torch.isfinite(p).all()) for p in resumed.model.parameters())
    # the Guard's state came back from the checkpoint: the run's start is the first run's
    assert first.run is not None and first.run.verdict is not None
    assert callback.run.verdict is not None
    assert callback.run.verdict.start == first.run.verdict.start
    ratio = eval_loss(resumed.model) / eval_loss(healthy.model)
    print(f"final eval loss: resumed {eval_loss(resumed.model):.4f}, "
          f"healthy {eval_loss(healthy.model):.4f}")
    assert abs(ratio - 1) < 0.05, ratio
