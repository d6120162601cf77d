"""A regression loss handed predictions and targets of shapes that broadcast to n x n ((N, 1)
against (N,)) is read from the loss's autograd graph, after the backward too: told once, as a
warning finding at the first step; same shapes, a scalar target or a learned vector fitted to a
batch of targets are not."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainguard import Guard, GuardConfig
from trainguard.diagnose.loss_broadcast import loss_broadcast

QUIET = {"sinks": {"console": False}, "probes": {"preflight": False}}
HEAD = nn.Linear(5, 1)


def _x(rows: int = 16) -> torch.Tensor:
    return torch.randn(rows, 5, generator=torch.Generator().manual_seed(0))


def _y(rows: int = 16) -> torch.Tensor:
    return torch.randn(rows, generator=torch.Generator().manual_seed(1))


TOLD: dict[str, Callable[[], torch.Tensor]] = {
    "mse_column_against_vector": lambda: F.mse_loss(HEAD(_x()), _y()),
    "mse_vector_against_column": lambda: F.mse_loss(HEAD(_x()).squeeze(-1), _y()[:, None]),
    "mse_module": lambda: nn.MSELoss()(HEAD(_x()), _y()),
    "l1": lambda: F.l1_loss(HEAD(_x()), _y()),
    "smooth_l1": lambda: F.smooth_l1_loss(HEAD(_x()), _y()),
    "huber": lambda: F.huber_loss(HEAD(_x()), _y()),
    "unreduced_then_mean": lambda: F.mse_loss(HEAD(_x()), _y(), reduction="none").mean(),
    "plus_a_regulariser": lambda: F.mse_loss(HEAD(_x()), _y())
    + 0.01 * sum(p.square().sum() for p in HEAD.parameters()),
}
QUIET_LOSSES: dict[str, Callable[[], torch.Tensor]] = {
    "same_shapes": lambda: F.mse_loss(HEAD(_x()), _y()[:, None]),
    "squeezed_prediction": lambda: F.mse_loss(HEAD(_x()).squeeze(-1), _y()),
    "l1_same_shapes": lambda: F.l1_loss(HEAD(_x()), _y().view(-1, 1)),
    "a_scalar_target": lambda: F.mse_loss(HEAD(_x()), torch.tensor(0.5)),
    "one_row": lambda: F.mse_loss(HEAD(_x(1)), _y(1)),
    # one learned vector fitted to a batch of them: broadcast, each target scored once
    "a_centroid": lambda: F.mse_loss(nn.Parameter(torch.zeros(5)) * 1.0, _x()),
    "cross_entropy": lambda: F.cross_entropy(nn.Linear(5, 3)(_x()), torch.arange(16) % 3),
}


def _quietly(make: Callable[[], torch.Tensor]) -> torch.Tensor:
    with warnings.catch_warnings():  # torch's own size warning
        warnings.simplefilter("ignore", UserWarning)
        return make()


@pytest.mark.parametrize("name", sorted(TOLD))
def test_predictions_broadcast_against_targets_are_told(name: str) -> None:
    loss = _quietly(TOLD[name])
    loss.backward()  # read after the backward, as the Guard does: its saved tensors are gone
    found = loss_broadcast(loss)
    assert found is not None and (found.check, found.cause) == ("loss_broadcast",
                                                                "loss_broadcast")
    assert found.evidence["broadcast_shape"] == [16, 16]
    assert "(16, 16)" in found.message and "squeeze" in found.fix


@pytest.mark.parametrize("name", sorted(QUIET_LOSSES))
def test_shapes_that_agree_or_broadcast_one_way_are_not(name: str) -> None:
    loss = _quietly(QUIET_LOSSES[name])
    assert loss_broadcast(loss) is None
    loss.backward()
    assert loss_broadcast(loss) is None


def test_a_loss_without_a_graph_says_nothing() -> None:
    assert loss_broadcast(_quietly(lambda: F.mse_loss(HEAD(_x()), _y())).detach()) is None
    assert loss_broadcast(0.3) is None


def _guarded(flat_targets: bool, steps: int = 30) -> Guard:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET))
    x = _x(64)
    y = x.sum(dim=1)  # (64,): a dataset of scalars
    target = y if flat_targets else y[:, None]
    for _ in range(steps):
        loss = _quietly(lambda: F.mse_loss(model(x), target))
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    return guard


@pytest.mark.parametrize("flat_targets", [True, False])
def test_the_guard_tells_it_once_and_ranks_it_first(flat_targets: bool) -> None:
    guard = _guarded(flat_targets)
    told = [f for f in guard.findings if f.check == "loss_broadcast"]
    assert len(told) == (1 if flat_targets else 0)
    if flat_targets:
        assert guard.diagnose()[0].code == "loss_broadcast"
    guard.close()


class _Regressor(nn.Module):
    """A custom model handed to the HF Trainer that computes its own loss on a (B, 1) head
    against the dataset's scalar labels."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(5, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": F.mse_loss(self.net(x), labels)}


def test_the_hf_trainer_shows_the_loss_before_it_detaches_it(tmp_path: object) -> None:
    transformers = pytest.importorskip("transformers")
    from trainguard.hf import TrainguardCallback

    torch.manual_seed(0)
    rows = [{"x": torch.randn(5), "labels": torch.randn(())} for _ in range(32)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=8, report_to=[],
        save_strategy="no", logging_strategy="no", disable_tqdm=True)
    callback = TrainguardCallback(GuardConfig(**QUIET), run_dir=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        transformers.Trainer(model=_Regressor(), args=args, train_dataset=rows,
                             callbacks=[callback]).train()
    assert [f.check for f in callback.run.findings].count("loss_broadcast") == 1
