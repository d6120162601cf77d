"""The batch watcher along training: reported once, and the spike batch above chance level."""

from __future__ import annotations

import torch
from torch import nn

from trainguard.diagnose.batch_watch import BatchWatch


def _lm_batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


def test_a_spike_far_above_chance_after_a_model_that_understood_the_data() -> None:
    watch = BatchWatch(nn.Embedding(64, 8), expected_batch_size=None)  # ln 64 = 4.16
    kinds = [e.kind for e in watch.events(_lm_batch(), 60, True, None, loss=9.0, level=0.9)]
    assert kinds == ["batch_above_chance"]
    again = watch.events(_lm_batch(), 61, True, None, loss=9.0, level=0.9)
    assert again == [], "an ongoing finding is reported once"


def test_a_fresh_or_damaged_model_above_chance_is_not_the_batch() -> None:
    watch = BatchWatch(nn.Embedding(64, 8), expected_batch_size=None)
    fresh = watch.events(_lm_batch(), 1, True, None, loss=25.0, level=4.16)  # at chance before
    damaged = watch.events(_lm_batch(), 90, True, None, loss=25.0, level=9.0)  # above before
    no_spike = watch.events(_lm_batch(), 5, True, None, loss=25.0, level=None)
    assert fresh == damaged == no_spike == []


def test_nonfinite_input_is_known_while_it_lasts() -> None:
    watch = BatchWatch(nn.Linear(4, 1), expected_batch_size=None)
    bad = {"x": torch.tensor([[float("nan"), 0.0, 0.0, 0.0]])}
    assert [e.kind for e in watch.events(bad, 3, True, None)] == ["batch_nonfinite"]
    assert watch.nonfinite_input
    assert watch.events(bad, 4, True, None) == [] and watch.nonfinite_input  # once, still known
    watch.events({"x": torch.zeros(1, 4)}, 5, True, None)
    assert not watch.nonfinite_input
