"""The `act` stage (`pipeline/act.py`) as a loop meets it."""

from __future__ import annotations

import torch
from torch import nn

import trainguard


def test_a_clip_on_every_step_keeps_adams_second_moment_sum_carried() -> None:
    """A fixed `max_grad_norm` that clips every step scales the gradients after the precursor
    probe measured them: the probe is told the factor, so its sum of Adam's v stays carried by
    the recursion (no pass over the moments) and equal to the sum the optimizer holds."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = trainguard.GuardConfig(sinks={"console": False}, clip={"max_grad_norm": 1e-3},
                                    detectors={"instability_precursor": {"every": 1}})
    guard = trainguard.Guard(model, optimizer, config=config)
    probe = guard.run.services.watch.adam_probe
    ages = []
    for _ in range(12):
        x = torch.randn(16, 8)
        loss = nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long())
        loss.backward()
        report = guard.step(loss)
        assert report is not None and report.action == "clipped"
        optimizer.zero_grad(set_to_none=True)
        ages.append(None if probe._carried is None else probe._carried.age)
    assert ages[-1] is not None and ages[-1] >= 8, ages  # carried step after step, not summed
    assert probe._carried is not None
    carried = probe._carried.sums
    summed = torch.stack([optimizer.state[p]["exp_avg_sq"].sum()
                          for p in guard.run.services.watched.params])
    assert torch.allclose(carried, summed, rtol=1e-4)
    guard.close()
