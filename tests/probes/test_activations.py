"""The activation probe reads the forwards training learns from."""

from __future__ import annotations

import torch
from torch import nn

from trainguard.probes.activations import ActivationProbe, batch_unit_stats


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


def test_the_batch_statistics_follow_their_definitions() -> None:
    """Dead units (zero for every sample) and the spread across the batch (each unit's sample
    standard deviation, averaged, over the mean |output|), NaN and inf shown, not hidden."""
    torch.manual_seed(0)
    relu = torch.relu(torch.randn(64, 8, 16))
    relu[:, 2] = 0.0  # 16 of the 128 units dead
    relu[:, 3] = -0.0
    nan = torch.randn(6, 5)
    nan[2, 3] = float("nan")
    for t in (relu, torch.randn(8, 16, 32), torch.ones(5, 3) * 7, torch.zeros(4, 10), nan):
        dead, spread = batch_unit_stats(t)
        units = t.reshape(t.shape[0], -1).float()
        assert float(dead) == float(1.0 - units.ne(0).any(dim=0).float().mean())
        expected = units.std(dim=0).mean() / units.abs().mean().clamp_min(1e-12)
        assert torch.allclose(spread, expected, rtol=1e-5, atol=0.0, equal_nan=True)
    assert float(batch_unit_stats(relu)[0]) == 0.25
    assert float(batch_unit_stats(torch.ones(5, 3) * 7)[1]) == 0.0  # a collapsed layer
    assert bool(batch_unit_stats(nan)[1].isnan())
