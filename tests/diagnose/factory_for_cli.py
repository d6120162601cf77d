"""Factories the CLI tests load with --factory."""

from __future__ import annotations

import torch

from trainguard.demo import TinyCausalLM


def model_and_loss():
    torch.manual_seed(0)
    return TinyCausalLM(vocab_size=32, d_model=32, n_layer=2, n_head=2, max_len=32), (
        lambda model, batch: model.loss(batch["input_ids"]))


def bad_setup():
    model = TinyCausalLM(vocab_size=32, d_model=32, n_layer=1, n_head=2, max_len=32)
    return model, torch.optim.AdamW(model.parameters(), lr=1.0, eps=1e-16, betas=(0.9, 0.9))


def warmup_only_setup():
    """A setup whose worst finding is a warning: Adam at the top of its range, no warmup."""
    torch.manual_seed(0)
    model = TinyCausalLM(vocab_size=32, d_model=32, n_layer=1, n_head=2, max_len=32)
    return model, torch.optim.AdamW(model.parameters(), lr=5e-2)


def clean_setup():
    torch.manual_seed(0)
    model = TinyCausalLM(vocab_size=32, d_model=32, n_layer=1, n_head=2, max_len=32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20))
    return model, optimizer, scheduler


def regression_setup():
    """An MLP regression, its AdamW and its loss: `trainguard prove`'s factory."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optimizer, (
        lambda model, batch: torch.nn.functional.mse_loss(model(batch["x"]), batch["y"]))


def regression_setup_without_dropout():
    """`regression_setup` with its dropout left out: the same parameters, another forward."""
    model, optimizer, loss_fn = regression_setup()
    model[2] = torch.nn.Identity()
    return model, optimizer, loss_fn


def _hang() -> None:
    """Wait as a hung data loader would: until the file $TRAINGUARD_TEST_RELEASE exists (30 s at
    most), having made $TRAINGUARD_TEST_STARTED; then fail, so that a worker left behind ends."""
    import os
    import time
    from pathlib import Path

    started, release = (os.environ.get(f"TRAINGUARD_TEST_{name}") for name in ("STARTED",
                                                                               "RELEASE"))
    if started:
        Path(started).touch()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (release and Path(release).exists()):
        time.sleep(0.05)
    raise RuntimeError("released")


def hanging_loss_setup():
    """`regression_setup` whose loss_fn never returns."""
    model, optimizer, _ = regression_setup()

    def loss_fn(model, batch):
        _hang()

    return model, optimizer, loss_fn


def hanging_replay_setup():
    """(model, loss_fn) for `replay`, whose loss_fn never returns."""
    model, _, loss_fn = hanging_loss_setup()
    return model, loss_fn


def hanging_factory():
    """A factory that never returns."""
    _hang()
