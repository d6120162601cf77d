"""A scheduler shorter than the run, told before the first step where the run's length is known:
a decay that sits at LR 0 past its end, a OneCycleLR that refuses to step past it; a cosine that
goes round again, a schedule as long as the run, a lambda of unknown length are not told."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainguard.diagnose.preflight import preflight
from trainguard.diagnose.schedule_end import lrs_at, schedule_end


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.AdamW(nn.Linear(4, 4).parameters(), lr=1e-3)


def test_a_polynomial_decay_shorter_than_the_run_is_told_from_its_end() -> None:
    scheduler = torch.optim.lr_scheduler.PolynomialLR(_optimizer(), total_iters=50, power=1.0)
    [finding] = schedule_end(scheduler, 120)
    assert (finding.check, finding.severity, finding.cause) == (
        "schedule_end", "warning", "lr_at_zero")
    assert "LR is 0 from step 50 on, so the last 70 steps would train nothing" in finding.message


def test_the_transformers_linear_decay_is_told_and_its_cosine_is_not() -> None:
    transformers = pytest.importorskip("transformers")
    linear = transformers.get_linear_schedule_with_warmup(_optimizer(), 10, 64)
    assert [f.cause for f in schedule_end(linear, 192)] == ["lr_at_zero"]
    cosine = transformers.get_cosine_schedule_with_warmup(_optimizer(), 10, 64)
    assert schedule_end(cosine, 192) == []  # it rises again past its end: not held at 0
    assert schedule_end(linear, 64) == []  # as long as the run


def test_a_one_cycle_that_would_stop_the_run_is_told() -> None:
    optimizer = _optimizer()
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=50)
    [finding] = schedule_end(scheduler, 80)
    assert finding.cause is None
    assert "stops with a ValueError after 51 optimizer steps" in finding.message
    optimizer.step()
    for _ in range(50):  # what it says: the 51st step raises
        scheduler.step()
    with pytest.raises(ValueError):
        scheduler.step()


@pytest.mark.parametrize("case", ["unknown_length", "under_way", "no_total"])
def test_what_is_not_told(case: str) -> None:
    optimizer = _optimizer()
    if case == "unknown_length":  # a lambda of the user's: its length is not known
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / 50))
    else:
        scheduler = torch.optim.lr_scheduler.PolynomialLR(optimizer, total_iters=50)
    if case == "under_way":  # a schedule already stepped: a resumed run's, not judged
        optimizer.step()
        scheduler.step()
    assert schedule_end(scheduler, None if case == "no_total" else 120) == []


def test_reading_past_the_end_leaves_the_scheduler_as_it_was() -> None:
    optimizer = _optimizer()
    scheduler = torch.optim.lr_scheduler.PolynomialLR(optimizer, total_iters=50, power=1.0)
    before = (scheduler.last_epoch, scheduler.get_last_lr(), optimizer.param_groups[0]["lr"])
    assert list(lrs_at(scheduler, [60, 25])) == [[0.0], pytest.approx([5e-4])]
    assert (scheduler.last_epoch, scheduler.get_last_lr(),
            optimizer.param_groups[0]["lr"]) == before


@pytest.mark.parametrize("total", [101, 409_501])
def test_a_cosine_that_goes_round_again_or_a_step_at_zero_is_not_told(total: int) -> None:
    """Past T_max a cosine is back up a step later: read at a stride of 2 T_max over a long
    run, every value would be one of its zeros; and one step at 0 is no news."""
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(_optimizer(), T_max=100)
    assert schedule_end(scheduler, total) == []


def test_the_preflight_tells_it_when_given_the_runs_length() -> None:
    optimizer = _optimizer()
    model = nn.Linear(4, 4)
    scheduler = torch.optim.lr_scheduler.PolynomialLR(optimizer, total_iters=50, power=1.0)
    assert "schedule_end" in [f.check for f in preflight(model, optimizer, scheduler,
                                                          total_steps=200)]
    assert "schedule_end" not in [f.check for f in preflight(model, optimizer, scheduler)]


def test_the_hf_trainer_hands_its_length_to_the_preflight(tmp_path: object) -> None:
    transformers = pytest.importorskip("transformers")
    from trainguard.hf import TrainguardCallback

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=16))
    rows = [{"input_ids": torch.arange(16) % 50, "labels": torch.arange(16) % 50}] * 32
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # sized for one epoch of the three trained
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, 2, 8)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), num_train_epochs=3, per_device_train_batch_size=4,
        report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True)
    callback = TrainguardCallback(run_dir=None)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows,
                                   optimizers=(optimizer, scheduler), callbacks=[callback])
    trainer.train()
    [finding] = [f for f in callback.run.findings if f.check == "schedule_end"]
    assert "sized for 8 optimizer steps and the run takes 24" in finding.message
