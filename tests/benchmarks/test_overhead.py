"""`benchmarks/overhead.py`'s reference variants do what they say (their times are not tested)."""

from __future__ import annotations

import torch
from benchmarks.overhead import build_workload, make_variant


def test_least_guard_applies_a_calm_step_and_skips_a_nonfinite_one() -> None:
    workload = build_workload("mlp", torch.device("cpu"))
    variant = make_variant("least_guard", workload, torch.device("cpu"))
    before = [p.detach().clone() for p in variant.params]
    variant.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, variant.params, strict=True))
    assert variant.last_norm is not None and variant.last_norm > 0
    after_one = [p.detach().clone() for p in variant.params]
    loss = variant.forward_backward(variant._batch())
    variant.update(loss * float("nan"))  # a NaN loss: the step is not applied
    assert all(torch.equal(a, p) for a, p in zip(after_one, variant.params, strict=True))
