"""A tiny HF Trainer run whose LR a callback raises a thousandfold midway, reported to a tracker:
the same run then read from the tracker's store and from its `trainer_state.json`."""

from __future__ import annotations

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
    for name in ("verdict", "kind", "onset_step", "evidence", "rows"):
        assert getattr(a, name) == getattr(b, name), name
    assert [c.to_dict() for c in a.causes] == [c.to_dict() for c in b.causes]
    assert [(e.kind, e.step) for e in a.events] == [(e.kind, e.step) for e in b.events]
