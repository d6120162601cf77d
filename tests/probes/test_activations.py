"""The activation probe reads the forwards training learns from."""

from __future__ import annotations

import torch
from torch import nn

from trainguard.probes.activations import ActivationProbe


def test_forwards_without_gradients_are_not_read() -> None:
    """A loop that samples its own completions runs the model under `torch.no_grad()` first,
    from one start token for every sample: that forward is not the batch it trains on, and its
    constant output would read as a collapsed layer."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 4))
    probe = ActivationProbe(model)
    probe.attach()
    with torch.no_grad():
        model(torch.zeros(16, 1, dtype=torch.long))  # generation from the start token
    model(torch.arange(16).reshape(16, 1) % 8).sum().backward()  # the forward that trains
    seen = probe.detach()
    assert seen is not None
    names, stats = seen
    assert names == ["0", "1"]
    assert bool((stats["act_batch_spread"] > 0).all())
