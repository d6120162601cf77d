"""Random number generator states (`rng.py`): torch's own for a replayed forward, the whole
process's for a rollback and a crash snapshot."""

from __future__ import annotations

import io
import random

import numpy as np
import torch

from tests.diagnose.test_counterfactual import mlp, regression
from trainguard.rng import process_state, put_process_state, put_torch_state, torch_state


def test_torch_state_put_back_gives_the_same_dropout_masks() -> None:
    model = mlp(dropout=0.5)
    x = regression()["x"]
    state = torch_state()
    first = model(x)
    put_torch_state(state)
    assert torch.equal(model(x), first)


def test_process_state_puts_back_every_generator() -> None:
    state = process_state()
    drawn = (torch.rand(3), random.random(), np.random.rand(3))
    torch.rand(5), random.random(), np.random.rand(7)  # the generators move on
    put_process_state(state)
    again = (torch.rand(3), random.random(), np.random.rand(3))
    assert torch.equal(drawn[0], again[0])
    assert drawn[1] == again[1]
    assert np.array_equal(drawn[2], again[2])


def test_process_state_loads_with_weights_only() -> None:
    """A crash snapshot stores it: plain tensors and numbers only."""
    buffer = io.BytesIO()
    torch.save(process_state(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    expected = random.random()
    random.random()
    put_process_state(loaded)
    # the state saved before the first draw above gives that draw again
    assert random.random() == expected
