"""Saved states: an exact copy, restored bit for bit, never aliased with live training."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainguard.recovery.state import capture, finite_flag, restore

from .helpers import make_workload


def _losses(w, steps: range) -> list[float]:
    out = []
    for step in steps:
        loss = w.loss(w.batch(step))
        loss.backward()
        w.optimizer.step()
        w.scheduler.step()
        w.optimizer.zero_grad(set_to_none=True)
        out.append(loss.item())
    return out


def test_restore_reproduces_the_same_losses_bit_for_bit() -> None:
    w = make_workload()
    _losses(w, range(15))
    saved = capture(step=15, model=w.model, optimizers=[w.optimizer], scheduler=w.scheduler,
                    scaler=None, guard_state={})
    first = _losses(w, range(15, 30))  # dropout draws from the RNG: it must be restored too
    for _ in range(2):  # twice: training after the first restore must not touch the saved copy
        restore(saved, model=w.model, optimizers=[w.optimizer], scheduler=w.scheduler,
                scaler=None)
        assert _losses(w, range(15, 30)) == first
    assert w.scheduler.last_epoch == 30


def test_capture_reuses_buffers_of_a_spare_state() -> None:
    w = make_workload()
    _losses(w, range(3))
    old = capture(step=3, model=w.model, optimizers=[w.optimizer], scheduler=w.scheduler,
                  scaler=None, guard_state={})
    buffer = old.model["0.weight"]
    _losses(w, range(3, 5))
    new = capture(step=5, model=w.model, optimizers=[w.optimizer], scheduler=w.scheduler,
                  scaler=None, guard_state={}, reuse=old)
    assert new.model["0.weight"] is buffer
    assert torch.equal(new.model["0.weight"], w.model[0].weight)
    assert new.nbytes > 0


def test_finite_flag_sees_nan_in_weights_and_in_optimizer_moments() -> None:
    w = make_workload()
    _losses(w, range(2))
    assert finite_flag(w.model, [w.optimizer]).item() == 1.0
    state = w.optimizer.state[w.model[3].weight]
    state["exp_avg_sq"][0, 0] = math.inf
    assert finite_flag(w.model, [w.optimizer]).item() == 0.0
    state["exp_avg_sq"][0, 0] = 0.0
    with torch.no_grad():
        w.model[0].bias[1] = math.nan
    assert finite_flag(w.model, [w.optimizer]).item() == 0.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_finite_flag_of_a_cuda_model_never_waits_for_the_device() -> None:
    """Adam's step counts stay on the host (a float tensor each): their flag reaches the device
    without a synchronisation."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4, device="cuda")).sum().backward()
    optimizer.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        flag = finite_flag(model, [optimizer])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert flag is not None and float(flag) == 1.0
