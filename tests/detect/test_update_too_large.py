from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import trainguard
from tests.detect.synth import NAN, default_config, restored, sampled_step
from trainguard.detect import UpdateTooLarge
from trainguard.events import StepReport
from trainguard.signals import StepSignals
from trainguard.sinks import Sink

NAMES = ["embed.weight", "block.0.weight", "block.0.bias", "head.weight", "head.bias"]


def first_update(ratios: list[float], step: int = 1) -> StepSignals:
    return sampled_step(step, per_param={"update_ratio": ratios}, names=NAMES)


def test_a_first_update_that_moves_the_typical_weight_by_a_fifth_is_reported() -> None:
    event, = UpdateTooLarge(default_config()).check(first_update([0.3, 0.5, 0.2, 0.9, 0.01]))
    assert (event.kind, event.step, event.severity) == ("update_too_large", 0, "warning")
    assert event.value == pytest.approx(0.3)  # the median, not the largest
    assert event.param == "head.weight"  # the one that moved the most
    assert event.details["signal"] == "update_ratio" and event.details["bound"] == 0.15
    assert event.details["params"] == 5
    assert "30% of its norm" in event.message and "head.weight" in event.message


def test_one_new_layer_moving_far_is_no_fault_when_the_rest_moves_little() -> None:
    """A head drawn from scratch moves far more than the pre-trained weights on its first
    step: the median is the typical weight's."""
    assert UpdateTooLarge(default_config()).check(first_update([1e-3, 2e-3, 1e-3, 0.9, 0.5])) == []


def test_weights_that_were_all_zeros_are_left_out() -> None:
    """LoRA's B and zero biases move by exactly their own size on their first step (ratio 1):
    with them the median would be 1."""
    ratios = [1.0, 1e-3, 1.0, 2e-3, 1.0]
    assert UpdateTooLarge(default_config()).check(first_update(ratios)) == []


def test_only_the_weights_of_real_layers_count() -> None:
    """Biases, norms' scales and a toy model's layers move by half their size on their first
    steps, as they should: only tensors of 1024 elements or more have a say (the count read from
    the probe's own statistics, norm^2 / (std^2 + mean^2))."""
    numel = np.array([8.0, 4096.0, 64.0, 4096.0, 4.0])
    mean, std = np.full(5, 0.01), np.full(5, 0.05)
    stats = {"update_ratio": [0.9, 0.01, 0.9, 0.02, 0.9],
             "weight_norm": np.sqrt(numel * (std ** 2 + mean ** 2)), "weight_std": std,
             "weight_mean": mean}
    assert UpdateTooLarge(default_config()).check(
        sampled_step(1, per_param=stats, names=NAMES)) == []
    stats["update_ratio"] = [0.01, 0.4, 0.01, 0.5, 0.01]
    event, = UpdateTooLarge(default_config()).check(sampled_step(1, per_param=stats, names=NAMES))
    assert event.value == pytest.approx(0.45) and event.details["params"] == 2


def test_only_the_first_measured_update_is_judged() -> None:
    detector = UpdateTooLarge(default_config())
    assert detector.check(first_update([1e-3] * 5, step=1)) == []
    assert detector.check(first_update([0.5] * 5, step=51)) == []  # later: other detectors' job
    # a step without an update measured does not count as the first
    fresh = UpdateTooLarge(default_config())
    assert fresh.check(sampled_step(1, per_param={"weight_norm": [1.0] * 5}, names=NAMES)) == []
    assert fresh.check(sampled_step(2, per_param={"update_ratio": [NAN] * 5}, names=NAMES)) == []
    event, = fresh.check(first_update([0.5] * 5, step=11))
    assert event.step == 10


def test_the_bound_is_configurable_and_state_survives_a_restore() -> None:
    step = first_update([0.1] * 5)
    assert UpdateTooLarge(default_config()).check(step) == []
    tight = default_config(update_too_large={"first_ratio": 0.05})
    assert len(UpdateTooLarge(tight).check(step)) == 1
    judged = UpdateTooLarge(default_config())
    judged.check(first_update([1e-3] * 5))
    again = restored(judged)
    assert again.check(first_update([0.5] * 5, step=2)) == []


def test_a_non_positive_bound_is_refused() -> None:
    with pytest.raises(trainguard.ConfigError, match=r"detectors\.update_too_large\.first_ratio"):
        trainguard.DetectorConfig(update_too_large={"first_ratio": 0.0})


# -- real runs ------------------------------------------------------------------------------------
def _fine_tune(lr: float, optimizer: str = "sgd", steps: int = 3) -> trainguard.Guard:
    """A small classifier, pre-trained a little, then fine-tuned at `lr` under a Guard."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 4))
    x, y = torch.randn(256, 16), torch.randint(0, 4, (256,))
    warm = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(20):
        nn.functional.cross_entropy(model(x), y).backward()
        warm.step()
        warm.zero_grad()
    opt = (torch.optim.SGD(model.parameters(), lr=lr) if optimizer == "sgd"
           else torch.optim.AdamW(model.parameters(), lr=lr))
    guard = trainguard.Guard(model, opt, config=trainguard.GuardConfig(sinks={"console": False}))
    for i in range(steps):
        batch = slice(64 * (i % 4), 64 * (i % 4 + 1))
        loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        loss.backward()
        guard.step(loss)
        opt.zero_grad(set_to_none=True)
    guard.close()
    return guard


def _kinds(guard: trainguard.Guard) -> list[str]:
    return [e.kind for e in guard.events]


def test_an_lr_that_rewrites_the_weights_is_named_from_the_first_step() -> None:
    guard = _fine_tune(lr=200.0)
    event = next(e for e in guard.events if e.kind == "update_too_large")
    assert event.step == 0 and event.value >= 0.15
    assert guard.diagnose()[0].code == "lr_too_high"


@pytest.mark.parametrize(("lr", "optimizer"), [(0.1, "sgd"), (1e-3, "adamw")])
def test_silent_at_a_sane_lr(lr: float, optimizer: str) -> None:
    assert "update_too_large" not in _kinds(_fine_tune(lr=lr, optimizer=optimizer))


def test_silent_on_a_toy_regression_trained_from_scratch() -> None:
    """nn.Linear(4, 1) under SGD: its first update moves the weight by half its size, and the
    run converges."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = trainguard.Guard(model, optimizer,
                             config=trainguard.GuardConfig(sinks={"console": False}))
    for _ in range(3):
        x = torch.randn(16, 4)
        loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    assert "update_too_large" not in _kinds(guard)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_silent_on_a_lora_fine_tune_whose_b_matrices_start_at_zero() -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = get_peft_model(GPT2LMHeadModel(GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=32)),
        LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn"]))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=2e-4)
    seen = Sampled()
    guard = trainguard.Guard(model, optimizer,
                             config=trainguard.GuardConfig(sinks={"console": False}),
                             sinks=[seen])
    ids = torch.randint(0, 100, (4, 32))
    for _ in range(2):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    assert "update_too_large" not in _kinds(guard)
    # the B matrices did start at zero: their first update ratio is exactly 1, and the rest
    # moved little
    names, ratios = seen.first_update
    b = [r for n, r in zip(names, ratios, strict=True) if "lora_B" in n]
    rest = [r for n, r in zip(names, ratios, strict=True) if "lora_B" not in n]
    assert b and all(r == 1.0 for r in b)
    assert rest and max(rest) < 0.15


class Sampled(Sink):
    """The first update ratios the Guard measured, as the sinks hear them."""

    def __init__(self) -> None:
        self.first_update: tuple[list[str], list[float]] | None = None

    def on_step(self, report: StepReport) -> None:
        signals = report.signals
        if self.first_update is not None or signals is None:
            return
        for sample in signals.sampled:
            if "update_ratio" in sample.per_param:
                self.first_update = (signals.param_names,
                                     [float(v) for v in sample.per_param["update_ratio"]])
