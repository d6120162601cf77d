"""The output probe reads the last forward training learns from."""

from __future__ import annotations

import torch
from torch import nn

from trainguard.probes.outputs import OUTPUT_KEYS, OutputProbe


def test_a_forward_without_gradients_after_the_training_one_is_not_read() -> None:
    """Completions sampled, or a reference model run, under `no_grad` after the forward that
    trains: the statistics stay those of the training forward."""
    torch.manual_seed(0)
    model = nn.Linear(3, 5)
    probe = OutputProbe(model)
    probe.attach()
    x = torch.randn(32, 3)
    model(x).sum().backward()
    expected = probe._stats
    assert expected is not None
    with torch.no_grad():
        model(torch.zeros(32, 3))  # one start token for every sample: a constant output
    seen = probe.detach()
    assert seen is not None and set(seen) == set(OUTPUT_KEYS)
    assert torch.equal(torch.stack([seen[k] for k in OUTPUT_KEYS]), expected)
