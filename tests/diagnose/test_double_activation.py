"""A loss that applies a softmax (or sigmoid) the model already applied is read from the loss's
autograd graph: told once, as a warning finding at the first step; the right pairings are not."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainguard import Guard, GuardConfig
from trainguard.diagnose.double_activation import double_activation

QUIET = {"sinks": {"console": False}, "probes": {"preflight": False}}


def _x() -> torch.Tensor:
    return torch.randn(8, 5, generator=torch.Generator().manual_seed(0))


Y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
SOFTMAX = nn.Sequential(nn.Linear(5, 3), nn.Softmax(dim=1))
LOGITS = nn.Linear(5, 3)
SIGMOID = nn.Sequential(nn.Linear(5, 1), nn.Sigmoid())
TARGET = (Y % 2).float().unsqueeze(1)

TOLD: dict[str, Callable[[], torch.Tensor]] = {
    "cross_entropy_on_softmax": lambda: F.cross_entropy(SOFTMAX(_x()), Y),
    "module_after_a_view": lambda: nn.CrossEntropyLoss()(SOFTMAX(_x()).view(8, 3), Y),
    "plus_a_regulariser": lambda: F.cross_entropy(SOFTMAX(_x()), Y)
    + 0.01 * sum(p.square().sum() for p in SOFTMAX.parameters()),
    "label_smoothing": lambda: F.cross_entropy(SOFTMAX(_x()), Y, label_smoothing=0.1),
    "bce_with_logits_on_sigmoid": lambda: F.binary_cross_entropy_with_logits(SIGMOID(_x()),
                                                                             TARGET),
    "cross_entropy_on_sigmoid": lambda: F.cross_entropy(torch.sigmoid(LOGITS(_x())), Y),
    "bce_with_logits_on_softmax": lambda: F.binary_cross_entropy_with_logits(
        SOFTMAX(_x()), F.one_hot(Y, 3).float()),
}
NLL_TOLD: dict[str, Callable[[], torch.Tensor]] = {
    "nll_on_softmax": lambda: F.nll_loss(SOFTMAX(_x()), Y),
    "nll_on_logits": lambda: F.nll_loss(LOGITS(_x()), Y),
    "nll_module_on_sequence_logits": lambda: nn.NLLLoss()(
        nn.Linear(5, 3)(torch.randn(2, 4, 5)).transpose(1, 2), Y[:8].view(2, 4)),
    "nll_on_a_convolution": lambda: F.nll_loss(nn.Conv2d(5, 3, 1)(torch.randn(2, 5, 4, 4)),
                                               torch.randint(0, 3, (2, 4, 4))),
    "nll_on_sigmoid": lambda: F.nll_loss(torch.sigmoid(LOGITS(_x())), Y),
}
QUIET_LOSSES: dict[str, Callable[[], torch.Tensor]] = {
    "cross_entropy_on_logits": lambda: F.cross_entropy(LOGITS(_x()), Y),
    "nll_on_log_softmax": lambda: F.nll_loss(torch.log(SOFTMAX(_x())), Y),
    "cross_entropy_on_log_softmax": lambda: F.cross_entropy(F.log_softmax(LOGITS(_x()), 1), Y),
    "bce_on_sigmoid": lambda: F.binary_cross_entropy(SIGMOID(_x()), TARGET),
    "mse": lambda: F.mse_loss(SOFTMAX(_x()), F.one_hot(Y, 3).float()),
    "nll_on_a_log_softmax_module": lambda: F.nll_loss(
        nn.Sequential(nn.Linear(5, 3), nn.LogSoftmax(dim=1))(_x()), Y),
    "nll_on_log_probabilities_by_hand": lambda: F.nll_loss(
        LOGITS(_x()) - LOGITS(_x()).logsumexp(1, keepdim=True), Y),
    # linear ops that mix log-probabilities: an ensemble's weighted sum, a verbalizer's map
    "nll_on_an_ensemble_of_log_probabilities": lambda: F.nll_loss(torch.einsum(
        "e,ebc->bc", torch.ones(2).softmax(0),
        torch.stack([F.log_softmax(LOGITS(_x()), -1), F.log_softmax(SOFTMAX[0](_x()), -1)])),
        Y),
    "nll_on_a_verbalizer": lambda: F.nll_loss(F.log_softmax(LOGITS(_x()), -1) @ torch.eye(3),
                                              Y),
    # nll_loss as a gather inside another loss (Q(s, a) under a squared error), and a
    # cross-entropy written out by hand (its logsumexp added)
    "nll_as_a_gather_in_q_learning": lambda: F.mse_loss(
        -F.nll_loss(LOGITS(_x()), Y, reduction="none"), torch.zeros(8)),
    "cross_entropy_by_hand": lambda: (lambda z: F.nll_loss(z, Y) + z.logsumexp(-1).mean())(
        LOGITS(_x())),
}


@pytest.mark.parametrize("name", sorted(TOLD))
def test_an_activation_applied_twice_is_told(name: str) -> None:
    loss = TOLD[name]()
    loss.backward()  # read after the backward, as the Guard does
    found = double_activation(loss)
    assert found is not None and found.cause == "double_activation"
    assert found.evidence["activation"] == ("sigmoid" if "sigmoid" in name else "softmax")


@pytest.mark.parametrize("name", sorted(NLL_TOLD))
def test_nll_loss_on_what_is_not_log_probabilities_is_told(name: str) -> None:
    found = double_activation(NLL_TOLD[name]())
    assert found is not None and (found.check, found.cause) == ("nll_input", "nll_input")
    assert found.evidence["input"] == ("probabilities" if "sigmoid" in name or "softmax" in name
                                       else "scores")
    assert "log_softmax" in found.fix


@pytest.mark.parametrize("name", sorted(QUIET_LOSSES))
def test_the_right_pairings_are_not(name: str) -> None:
    assert double_activation(QUIET_LOSSES[name]()) is None


def test_a_loss_without_a_graph_says_nothing() -> None:
    assert double_activation(F.cross_entropy(SOFTMAX(_x()), Y).detach()) is None
    assert double_activation(1.5) is None


def _guarded(model: nn.Module, loss_fn: Callable[[torch.Tensor], torch.Tensor], steps: int,
             lr: float) -> Guard:
    """A plain loop of `steps` steps under a Guard (left open)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    guard = Guard(model, optimizer, config=GuardConfig(**QUIET))
    for _ in range(steps):
        loss = loss_fn(model(_x()))
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    return guard


@pytest.mark.parametrize("softmax", [True, False])
def test_the_guard_tells_it_once_at_the_first_step(softmax: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3),
                          *([nn.Softmax(dim=1)] if softmax else []))
    guard = _guarded(model, lambda out: F.cross_entropy(out, Y), 30, 1e-3)
    told = [f for f in guard.findings if f.check == "double_activation"]
    assert len(told) == (1 if softmax else 0)
    if softmax:
        assert guard.diagnose()[0].code == "double_activation"
    guard.close()


def test_a_target_that_went_through_a_sigmoid_is_not_the_input() -> None:
    """Soft targets from a sigmoid (a teacher's, trained too) on the target side of the
    logits BCE: the input is the student's logits."""
    student, teacher = nn.Linear(5, 1), SIGMOID
    loss = F.binary_cross_entropy_with_logits(student(_x()).detach(), teacher(_x()))
    assert double_activation(loss) is None


class _SoftmaxClassifier(nn.Module):
    """A model that computes its own loss on its softmax output, as a custom model handed to
    the HF Trainer does."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 3), nn.Softmax(dim=-1))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": F.cross_entropy(self.net(x), labels)}


def test_the_hf_trainer_shows_the_loss_before_it_detaches_it(tmp_path: object) -> None:
    transformers = pytest.importorskip("transformers")
    from trainguard.hf import TrainguardCallback

    torch.manual_seed(0)
    rows = [{"x": torch.randn(5), "labels": torch.tensor(i % 3)} for i in range(32)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=8, report_to=[],
        save_strategy="no", logging_strategy="no", disable_tqdm=True)
    callback = TrainguardCallback(GuardConfig(**QUIET), run_dir=None)
    transformers.Trainer(model=_SoftmaxClassifier(), args=args, train_dataset=rows,
                         callbacks=[callback]).train()
    assert [f.check for f in callback.run.findings].count("double_activation") == 1


def test_lightning_shows_the_loss_before_it_detaches_it(tmp_path: object) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from trainguard.lightning import TrainguardCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(5, 3), nn.Softmax(dim=-1))

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor],
                          index: int) -> torch.Tensor:
            return F.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    data = torch.utils.data.TensorDataset(torch.randn(32, 5), torch.arange(32) % 3)
    callback = TrainguardCallback(GuardConfig(**QUIET))
    pl.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False,
               default_root_dir=str(tmp_path), callbacks=[callback]).fit(
        Module(), torch.utils.data.DataLoader(data, batch_size=8))
    assert [f.check for f in callback.run.findings].count("double_activation") == 1


def test_a_run_whose_loss_is_nll_of_raw_scores_gets_no_verdict_from_it() -> None:
    """-z[y] falls without bound whatever the model learns: its fall is no `healthy`."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
    guard = _guarded(model, lambda out: F.nll_loss(out, Y), 60, 1e-2)
    guard.close()
    assert guard.verdict.verdict is None
    assert guard.verdict.message.startswith("no verdict from the loss: it is nll_loss of raw")
