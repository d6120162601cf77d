"""Checkpoints of a real Lightning Trainer with `ModelCheckpoint(save_top_k=2)` keeping the newest
two (monitor="step"), on a run whose batches at steps 35 to 37 hold an inf: without trainguard
only NaN checkpoints are left; with the callback under observe the step-30 checkpoint is kept,
marked healthy, and the NaN ones poisoned; under protect none is poisoned; `fit(ckpt_path=...)`
from `last_healthy_checkpoint` with the bad data still there ends where the healthy run ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainguard
from trainguard import GuardConfig
from trainguard.checkpoints import list_checkpoints
from trainguard.lightning import TrainguardCallback

from ..conftest import Actions

STEPS, BATCH, BAD_STEPS = 60, 16, range(35, 38)


def _data(bad: bool) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(8, 1, generator=gen)
    x = torch.randn(STEPS * BATCH, 8, generator=gen)
    y = x @ w + 0.05 * torch.randn(STEPS * BATCH, 1, generator=gen)
    if bad:
        for step in BAD_STEPS:
            x[step * BATCH, 0] = float("inf")
    return TensorDataset(x, y)


class ResumableLoader(DataLoader[Any]):
    """A loader whose state says how far it got, so that a resumed fit goes on from there (as
    torchdata's StatefulDataLoader does); Lightning saves it in its checkpoints."""

    def __init__(self, dataset: TensorDataset) -> None:
        super().__init__(dataset, batch_size=BATCH, shuffle=False)
        self.consumed = 0
        self.resume_at = 0

    def __iter__(self) -> Any:
        start, self.resume_at = self.resume_at, 0
        self.consumed = start
        for index, batch in enumerate(super().__iter__()):
            if index >= start:
                self.consumed += 1
                yield batch

    def state_dict(self) -> dict[str, int]:
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resume_at = int(state["consumed"])


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def fit(dirpath: Path, callback: TrainguardCallback | None, *, bad: bool = True,
        ckpt_path: Path | None = None) -> Regression:
    module = Regression()
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=dirpath, every_n_train_steps=10,
                                              save_top_k=2, monitor="step", mode="max")
    callbacks: list[Any] = [checkpoint] + ([callback] if callback is not None else [])
    trainer = pl.Trainer(max_steps=STEPS, callbacks=callbacks, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", num_sanity_val_steps=0)
    trainer.fit(module, ResumableLoader(_data(bad)),
                ckpt_path=str(ckpt_path) if ckpt_path is not None else None)
    return module


def finite(path: Path) -> bool:
    state = torch.load(path, weights_only=True)["state_dict"]
    return all(bool(torch.isfinite(v).all()) for v in state.values())


def eval_loss(module: Regression) -> float:
    x, y = _data(bad=False).tensors
    with torch.no_grad():
        return float(nn.functional.mse_loss(module.net(x), y))


def test_without_trainguard_only_nan_checkpoints_are_left(tmp_path: Path) -> None:
    fit(tmp_path, None)
    kept = sorted(tmp_path.glob("*.ckpt"))
    assert [p.name for p in kept] == ["epoch=0-step=50.ckpt", "epoch=0-step=60.ckpt"]
    assert not any(finite(p) for p in kept)


def test_observe_keeps_the_last_healthy_checkpoint_and_marks_the_nan_ones(
        tmp_path: Path) -> None:
    actions = Actions()
    callback = TrainguardCallback(GuardConfig(policy="observe", sinks={"console": False}),
                                  sinks=[actions])
    fit(tmp_path, callback)
    statuses = {e.path.name: e.status for e in list_checkpoints(tmp_path)}
    assert statuses == {"epoch=0-step=30.ckpt": "healthy", "epoch=0-step=50.ckpt": "poisoned",
                        "epoch=0-step=60.ckpt": "poisoned"}
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == sorted(statuses)  # no leftovers
    assert finite(tmp_path / "epoch=0-step=30.ckpt")
    assert trainguard.last_healthy_checkpoint(tmp_path) == tmp_path / "epoch=0-step=30.ckpt"
    kept = [a for a in actions.actions if a.kind == "checkpoint_kept"]
    assert len(kept) == 1 and "epoch=0-step=30.ckpt" in kept[0].message


def test_protect_poisons_no_checkpoint_and_older_ones_rotate_away(tmp_path: Path) -> None:
    fit(tmp_path, TrainguardCallback(GuardConfig(policy="protect", sinks={"console": False})))
    entries = list_checkpoints(tmp_path)
    assert [e.path.name for e in entries] == ["epoch=0-step=50.ckpt", "epoch=0-step=60.ckpt"]
    assert [e.status for e in entries] == ["healthy", "healthy"]
    assert len(list(tmp_path.iterdir())) == 6  # each file with its sidecar and state, no more


def test_a_resume_from_the_last_healthy_checkpoint_ends_as_the_healthy_run(
        tmp_path: Path) -> None:
    healthy = fit(tmp_path / "healthy", None, bad=False)
    first = TrainguardCallback(GuardConfig(policy="observe", sinks={"console": False}))
    fit(tmp_path / "broken", first)
    start = trainguard.last_healthy_checkpoint(tmp_path / "broken")
    assert start is not None and start.name == "epoch=0-step=30.ckpt"
    callback = TrainguardCallback(GuardConfig(policy="protect", sinks={"console": False}))
    resumed = fit(tmp_path / "resumed", callback, ckpt_path=start)  # the bad data is still there
    bad = sorted({e.step for e in callback.events if e.kind.startswith("nonfinite")})
    assert bad == list(BAD_STEPS)
    assert all(bool(torch.isfinite(p).all()) for p in resumed.parameters())
    # the Guard's state came back with the checkpoint: the run's start is the first run's
    assert first.run is not None and first.run.verdict is not None
    assert callback.run is not None and callback.run.verdict is not None
    assert callback.run.verdict.start == first.run.verdict.start
    ratio = eval_loss(resumed) / eval_loss(healthy)
    assert abs(ratio - 1) < 0.05, ratio
