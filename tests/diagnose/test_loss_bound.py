"""The most a cross-entropy of the model's own class scores can cost, measured on real models."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import trainguard
from trainguard.demo import MarkovLanguage, TinyCausalLM
from trainguard.diagnose.loss_bound import (
    BEYOND,
    CEILING_KEY,
    beyond,
    ceiling_of,
    check_first_loss,
)
from trainguard.probes.logz import LogZProbe

from ..conftest import torch_threads


def _model_and_batch(seed: int = 0) -> tuple[TinyCausalLM, torch.Tensor]:
    torch.manual_seed(seed)
    return (TinyCausalLM(vocab_size=32, d_model=32, n_layer=2, n_head=2, max_len=32),
            MarkovLanguage(vocab_size=32, seed=seed).batch(8, 17))


def _ceiling(model: TinyCausalLM, tokens: torch.Tensor) -> tuple[torch.Tensor, float]:
    probe = LogZProbe(model)
    with torch.enable_grad():  # the probe reads the forwards training learns from
        logits = model(tokens[:, :-1]).detach()
    rows = probe.take()
    assert rows is not None
    measured = ceiling_of(probe.values(rows.numpy().astype('float64')))
    probe.close()
    assert measured is not None
    return logits, measured


def test_no_target_costs_more_than_the_ceiling_and_a_sum_does() -> None:
    with torch_threads(1):
        model, tokens = _model_and_batch()
        logits, ceiling = _ceiling(model, tokens)
        rows = logits.reshape(-1, 32)
        worst = rows.argmin(-1)  # the least likely class at every position
        with torch.no_grad():
            mean = float(F.cross_entropy(rows, tokens[:, 1:].reshape(-1)))
            wrong = float(F.cross_entropy(rows, worst))
            smoothed = float(F.cross_entropy(rows, worst, label_smoothing=0.1))
            summed = float(F.cross_entropy(rows, tokens[:, 1:].reshape(-1), reduction="sum"))
    assert mean < wrong <= ceiling * (1 + 1e-6) and smoothed <= ceiling
    assert not beyond(mean, ceiling) and not beyond(wrong, ceiling)
    assert beyond(summed, ceiling)  # 8 x 16 tokens summed


def test_ids_from_a_permuted_vocabulary_stay_under_the_ceiling() -> None:
    """The mechanism of a tokenizer mismatch: a trained model reading ids whose meaning moved is
    far above its loss, yet within what its scores allow."""
    with torch_threads(1):
        model, _ = _model_and_batch()
        language = MarkovLanguage(vocab_size=32, seed=0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for _ in range(150):
            model.loss(language.batch(8, 17)).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        tokens = language.batch(8, 17)
        permuted = torch.randperm(32, generator=torch.Generator().manual_seed(1))[tokens]
        with torch.no_grad():
            understood = float(model.loss(tokens))
            logits, ceiling = _ceiling(model, permuted)
            misread = float(F.cross_entropy(logits.reshape(-1, 32), permuted[:, 1:].reshape(-1)))
    assert misread > 1.5 * math.log(32) > understood  # far above chance: the ids mean nothing
    assert misread <= ceiling and not beyond(misread, ceiling)


def test_a_first_loss_summed_over_the_tokens_is_a_note_on_its_reduction() -> None:
    with torch_threads(1):
        model, tokens = _model_and_batch()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        guard = trainguard.Guard(model, optimizer,
                                 config=trainguard.GuardConfig(sinks={"console": False}))
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 32), tokens[:, 1:].reshape(-1),
                               reduction="sum")
        loss.backward()
        guard.step(loss, batch={"input_ids": tokens})
        guard.close()
    checks = {f.check: f for f in guard.findings}
    # a fresh model summed over 128 tokens is far above chance, but no vocabulary did that
    assert "batch_above_chance" not in checks
    note = checks["loss_beyond_scores"]
    assert note.severity == "info" and note.cause == "loss_reduction"
    assert note.evidence["loss"] >= BEYOND * note.evidence["ceiling"]


def test_the_mean_first_loss_says_nothing() -> None:
    assert check_first_loss(3.5, 10.0) is None
    assert check_first_loss(float("nan"), 10.0) is None
    assert check_first_loss(500.0, None) is None  # not measured: nothing is known
    found = check_first_loss(500.0, 10.0)
    assert found is not None and found.cause == "loss_reduction"


@pytest.mark.parametrize("value", [None, np.array(math.nan), np.array(math.inf),
                                   np.array(0.0), np.array([])])
def test_a_ceiling_not_measured_or_not_finite_is_unknown(value) -> None:
    precursors = {} if value is None else {CEILING_KEY: value}
    assert ceiling_of(precursors) is None
    assert not beyond(1e9, ceiling_of(precursors))
    assert ceiling_of({CEILING_KEY: np.array([12.5])}) == 12.5
