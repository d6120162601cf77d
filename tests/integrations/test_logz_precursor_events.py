"""The HF Trainer callback and the Lightning callback get the same log Z `instability_precursor`
events as a plain loop over the same model, optimizer, data and loss. From `SHIFT_FROM` a forward
hook on the model adds `SHIFT` nats a step to every output logit: cross-entropy does not move
(it only sees the logits' differences), log Z climbs (its mean and its largest position alike),
and each path warns at the same step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from trainguard import Guard, GuardConfig
from trainguard.events import Event

SHIFT_FROM = 60
SHIFT = 0.5
STEPS = SHIFT_FROM + 12
LR = 1e-6
"""So small that the loss stays put: log Z growing while a model still learns does not warn."""
CONFIG = {"policy": "observe", "sinks": {"console": False}}


def logz_warnings(events: list[Event]) -> list[tuple[int, str | None]]:
    return [(e.step, e.param) for e in events if e.kind == "instability_precursor"
            and e.details.get("signal") == "logz_max"]


class ShiftLogits:
    """Forward hook (registered before the Guard's): the logits plus `SHIFT` x the steps since
    `SHIFT_FROM`, counted over training forwards."""

    def __init__(self, model: nn.Module) -> None:
        self.calls = 0
        model.register_forward_hook(self)

    def shift(self) -> float:
        return SHIFT * max(0, self.calls - SHIFT_FROM + 1)

    def __call__(self, module: nn.Module, args: Any, output: Any) -> Any:
        if not module.training:
            return output
        shift, self.calls = self.shift(), self.calls + 1
        if isinstance(output, torch.Tensor):
            return output + shift
        output.logits = output.logits + shift
        return output


# -- Hugging Face -------------------------------------------------------------------------------
def tiny_gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64,
                                      n_positions=16, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0))


def one_sequence() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


def test_the_hf_callback_warns_on_log_z_as_the_plain_loop_does(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers import Trainer, TrainingArguments

    from trainguard.hf import TrainguardCallback

    data = [one_sequence() for _ in range(16)]
    model = tiny_gpt2()
    ShiftLogits(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    guard = Guard(model, optimizer, config=GuardConfig(**CONFIG))
    batch = {k: torch.stack([d[k] for d in data[:4]]) for k in data[0]}
    for _ in range(STEPS):
        loss = model(**batch).loss
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad()
    guard.close()
    plain = logz_warnings(guard.events)

    model = tiny_gpt2()
    ShiftLogits(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    constant = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    callback = TrainguardCallback(GuardConfig(**CONFIG))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                             max_steps=STEPS, max_grad_norm=0.0, report_to="none",
                             save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[callback],
            optimizers=(optimizer, constant)).train()
    assert plain and plain[0][1] == "logits"
    assert SHIFT_FROM + 3 <= plain[0][0] <= SHIFT_FROM + 8
    assert logz_warnings(callback.events) == plain


# -- Lightning ----------------------------------------------------------------------------------
def classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def loader() -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8 * 16, 8, generator=generator)
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()),
        batch_size=8)


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = classifier()
        ShiftLogits(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def lightning_module(pl: Any) -> Any:
    class Classifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = classifier()
            ShiftLogits(self)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=LR, weight_decay=0.0)

    return Classifier()


@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
def test_the_lightning_callback_warns_on_log_z_as_the_plain_loop_does(namespace: str,
                                                                      tmp_path: Path) -> None:
    pl = pytest.importorskip(namespace)
    from trainguard.lightning import TrainguardCallback

    module = lightning_module(pl)
    callback = TrainguardCallback(GuardConfig(**CONFIG))
    pl.Trainer(max_steps=STEPS, accelerator="cpu", logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False,
               default_root_dir=str(tmp_path), callbacks=[callback]).fit(module, loader())

    model = Plain()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    guard = Guard(model, optimizer, config=GuardConfig(**CONFIG))
    step = 0
    while step < STEPS:
        for x, y in loader():
            if step == STEPS:
                break
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad()
            step += 1
    guard.close()
    plain = logz_warnings(guard.events)
    assert plain and SHIFT_FROM + 3 <= plain[0][0] <= SHIFT_FROM + 8
    assert logz_warnings(callback.events) == plain
