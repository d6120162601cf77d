"""The HF Trainer callback and the Lightning callback get the same `instability_precursor`
events as a plain loop over the same model, optimizer, data and loss. From `GROW_FROM` the
gradients are multiplied by a factor that grows 50% a step for `GROW_STEPS` steps (hooks on the
parameters' gradients, so whoever runs the backward gets them), and they outgrow Adam's second
moment while the loss itself is left as it is (a rise the loss explains is no precursor): each
path warns at the same step, naming the same parameter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from trainguard import Guard, GuardConfig
from trainguard.events import Event

GROW_FROM = 45
GROW_STEPS = 8
STEPS = GROW_FROM + GROW_STEPS + 4
LR = 1e-6
"""Small enough that the loss hardly moves (every batch is alike too): a rise while the loss
still comes down is learning, not a precursor."""
CONFIG = {"policy": "observe", "sinks": {"console": False}}
"""The default configuration: the precursor probe is on."""


def scale_at(step: int) -> float:
    if GROW_FROM <= step < GROW_FROM + GROW_STEPS:
        return 1.5 ** (step - GROW_FROM + 1)
    return 1.0


def precursors(events: list[Event]) -> list[tuple[int, str | None]]:
    return [(e.step, e.param) for e in events if e.kind == "instability_precursor"]


# -- Hugging Face -------------------------------------------------------------------------------
def tiny_gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64,
                                      n_positions=16, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0))


class GrowGradients:
    """A forward hook on the model counts its training forwards; a hook on each parameter's
    gradient multiplies it by `scale_at` of the forward it comes from."""

    def __init__(self, model: nn.Module) -> None:
        self.calls = 0
        model.register_forward_hook(self._count)
        for parameter in model.parameters():
            parameter.register_hook(self._scale)

    def _count(self, module: nn.Module, args: Any, output: Any) -> None:
        if module.training:
            self.calls += 1

    def _scale(self, grad: torch.Tensor) -> torch.Tensor:
        return grad * scale_at(self.calls - 1)


def one_sequence() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


def test_the_hf_callback_warns_as_the_plain_loop_does(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers import Trainer, TrainingArguments

    from trainguard.hf import TrainguardCallback

    # every item is the same sequence: the sampler's order cannot make the batches differ
    data = [one_sequence() for _ in range(16)]
    model = tiny_gpt2()
    GrowGradients(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    guard = Guard(model, optimizer, config=GuardConfig(**CONFIG))
    batch = {k: torch.stack([d[k] for d in data[:4]]) for k in data[0]}
    for _ in range(STEPS):
        loss = model(**batch).loss
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad()
    guard.close()
    plain = precursors(guard.events)

    model = tiny_gpt2()
    GrowGradients(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    constant = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    callback = TrainguardCallback(GuardConfig(**CONFIG))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                             max_steps=STEPS, max_grad_norm=0.0, report_to="none",
                             save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[callback],
            optimizers=(optimizer, constant)).train()
    assert plain and GROW_FROM <= plain[0][0] < GROW_FROM + GROW_STEPS
    assert precursors(callback.events) == plain


# -- Lightning ----------------------------------------------------------------------------------
def regression() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def loader() -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, 8, generator=generator).repeat(16, 1)  # every batch alike: a flat loss
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def lightning_module(pl: Any) -> Any:
    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = regression()
            GrowGradients(self.net)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=LR, weight_decay=0.0)

    return Regression()


@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
def test_the_lightning_callback_warns_as_the_plain_loop_does(namespace: str,
                                                             tmp_path: Path) -> None:
    pl = pytest.importorskip(namespace)
    from trainguard.lightning import TrainguardCallback

    module = lightning_module(pl)
    callback = TrainguardCallback(GuardConfig(**CONFIG))
    pl.Trainer(max_steps=STEPS, accelerator="cpu", logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False,
               default_root_dir=str(tmp_path), callbacks=[callback]).fit(module, loader())

    net = regression()
    GrowGradients(net)
    optimizer = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=0.0)
    guard = Guard(net, optimizer, config=GuardConfig(**CONFIG))
    step = 0
    while step < STEPS:
        for x, y in loader():
            if step == STEPS:
                break
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad()
            step += 1
    guard.close()
    plain = precursors(guard.events)
    assert plain and GROW_FROM <= plain[0][0] < GROW_FROM + GROW_STEPS
    assert [(s, p.removeprefix("net.")) for s, p in precursors(callback.events)
            if p is not None] == plain
