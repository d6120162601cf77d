"""A tiny HF Trainer run whose LR a callback raises a thousandfold midway, reported to a tracker:
the same run then read from the tracker's store and from its `trainer_state.json`."""

from __future__ import annotations

import re
from pathlib import Path

import torch

VOCAB = 64
STEPS = 40
RAISED_AT = 20


def trainer_run(output: Path, report_to: list[str]) -> Path:
    """Train, reporting to `report_to`; the path of the run's `trainer_state.json`."""
    from torch.utils.data import Dataset
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (STEPS * 4, 32), generator=generator)

    class Data(Dataset):
        def __len__(self) -> int:
            return len(ids)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": ids[i], "labels": ids[i]}

    class RaiseLR(TrainerCallback):  # a schedule gone wrong: the LR x1000 from one step on
        def on_step_begin(self, args, state, control, optimizer=None, lr_scheduler=None,
                          **kwargs):
            if state.global_step == RAISED_AT:
                lr_scheduler.base_lrs = [lr * 1000 for lr in lr_scheduler.base_lrs]
                for group in optimizer.param_groups:
                    group["lr"] *= 1000

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB,
                                       n_positions=32))
    args = TrainingArguments(output_dir=str(output), per_device_train_batch_size=4,
                             max_steps=STEPS, learning_rate=1e-3, lr_scheduler_type="constant",
                             save_strategy="no", report_to=report_to, use_cpu=True,
                             logging_steps=1, disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=[RaiseLR()])
    trainer.train()
    _close_trackers(report_to)
    state = output / "trainer_state.json"
    trainer.state.save_to_json(str(state))
    return state


def _close_trackers(report_to: list[str]) -> None:
    """End the tracker's run as the process's exit would: the HF callbacks leave a W&B run open
    (its last records still unwritten) and log to MLflow asynchronously."""
    if "wandb" in report_to:
        import wandb

        wandb.finish()
        wandb.teardown()  # finish() can return before the run log is written
    if "mlflow" in report_to:
        import mlflow

        mlflow.flush_async_logging()
        mlflow.end_run()


def same_judgement(a: object, b: object) -> None:
    """Two analyses of one run agree: verdict, kind, onset, evidence, causes, events."""
    from trainguard.analyze import Analysis

    assert isinstance(a, Analysis) and isinstance(b, Analysis)
    for name in ("verdict", "kind", "onset_step", "rows"):
        assert getattr(a, name) == getattr(b, name), name
    # a Lightning metrics.csv names its rows `epoch 0 (step 25)`, a tracker `step 25`
    assert [_by_step(e) for e in a.evidence] == [_by_step(e) for e in b.evidence]
    assert [_cause(c.to_dict()) for c in a.causes] == [_cause(c.to_dict()) for c in b.causes]
    assert [(e.kind, e.step) for e in a.events] == [(e.kind, e.step) for e in b.events]


POISONED_AT = 25


def lightning_run(root: Path, tracker: object) -> Path:
    """A small Lightning run whose inputs turn NaN at one batch, logged to `tracker` and to a
    CSVLogger at once; the path of the CSVLogger's `metrics.csv`."""
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class Regression(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

        def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
            x, y = batch
            if self.global_step == POISONED_AT:  # a corrupt batch: NaN in the inputs
                x = x * float("nan")
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, on_step=True, on_epoch=True)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(400, 8, generator=generator)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    torch.manual_seed(0)
    csv = CSVLogger(str(root), name="csv")
    trainer = L.Trainer(max_epochs=1, logger=[csv, tracker], log_every_n_steps=1,
                        enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, accelerator="cpu", devices=1)
    trainer.fit(Regression(), data)
    return Path(csv.log_dir) / "metrics.csv"


def _by_step(evidence: str) -> str:
    return re.sub(r"epoch \d+ \(step (\d+)\)", r"step \1", evidence)


def _cause(cause: dict[str, object]) -> dict[str, object]:
    evidence = cause["evidence"]
    assert isinstance(evidence, list)
    return {**cause, "evidence": [_by_step(e) for e in evidence]}
