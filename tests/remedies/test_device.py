"""Skip and clip on the device: bit for bit what the host path and clip_grad_norm_ do."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import pytest
import torch

from trainguard.demo import MarkovLanguage, TinyCausalLM
from trainguard.params import watched_params
from trainguard.probes.gradients import GradientProbe
from trainguard.probes.packing import DevicePack
from trainguard.remedies.clip import clip_coefficient
from trainguard.remedies.device import (
    clip_coefficients,
    nonfinite_flag,
    scale_on_device,
    skip_on_device,
    skips_on_device,
)

Make = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]

FUSED: dict[str, Make] = {
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True),
    "adam_amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, fused=True),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, fused=True),
    "sgd": lambda p: torch.optim.SGD(p, lr=1e-2, fused=True),
}


def tiny_lm(seed: int = 0) -> tuple[TinyCausalLM, MarkovLanguage]:
    torch.manual_seed(seed)
    return (TinyCausalLM(vocab_size=32, d_model=32, n_layer=2, n_head=2, max_len=32),
            MarkovLanguage(32, seed=seed))


def on_batch(model: TinyCausalLM, batch: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss = model.loss(batch)
    (loss * scale).backward()
    return loss.detach()


def backward(model: TinyCausalLM, language: MarkovLanguage, scale: float = 1.0) -> torch.Tensor:
    return on_batch(model, language.batch(8, 17), scale)


def state_copy(optimizer: torch.optim.Optimizer) -> list[dict[str, torch.Tensor]]:
    return [{k: v.clone() for k, v in optimizer.state[p].items()}
            for group in optimizer.param_groups for p in group["params"]]


def assert_same_state(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> None:
    assert len(a) == len(b)
    for one, other in zip(a, b, strict=True):
        assert one.keys() == other.keys()
        for key in one:
            assert torch.equal(one[key], other[key]), key


def global_norm(model: TinyCausalLM) -> torch.Tensor:
    """The global norm as the Guard's `measure` stage computes it on the device."""
    watched = watched_params(model, [torch.optim.SGD(model.parameters(), lr=0.0)])
    _, _, _, norm = GradientProbe(watched).measure(DevicePack(), torch.device("cpu"))
    return norm


@pytest.mark.parametrize("name", list(FUSED))
def test_a_nan_step_skipped_on_the_device_changes_nothing(name: str) -> None:
    """Parameters, moments and step count bit-identical, and the run goes on as the run that
    never called optimizer.step() for the bad step (the host path's skip)."""
    model, language = tiny_lm()
    optimizer = FUSED[name](list(model.parameters()))
    host_model = copy.deepcopy(model)
    host_optimizer = FUSED[name](list(host_model.parameters()))
    for step in range(5):
        batch = language.batch(8, 17)
        loss = on_batch(model, batch)
        assert torch.equal(loss, on_batch(host_model, batch))
        if step == 2:  # the bad step
            loss = loss * math.nan
            for p in model.parameters():
                assert p.grad is not None
                p.grad.fill_(math.nan)
        found_inf = nonfinite_flag(global_norm(model), loss)
        assert found_inf.item() == (1.0 if step == 2 else 0.0)
        if step >= 1:
            assert skips_on_device(optimizer)
        params = [p.detach().clone() for p in model.parameters()]
        before = state_copy(optimizer)
        with skip_on_device(optimizer, found_inf):
            optimizer.step()
        assert not hasattr(optimizer, "found_inf") and not hasattr(optimizer, "grad_scale")
        if step == 2:
            assert_same_state(before, state_copy(optimizer))
            for p, q in zip(model.parameters(), params, strict=True):
                assert torch.equal(p, q)
        else:
            host_optimizer.step()
        for p, q in zip(model.parameters(), host_model.parameters(), strict=True):
            assert torch.equal(p, q)
        if step != 2:
            assert_same_state(state_copy(optimizer), state_copy(host_optimizer))


def test_adam_skipped_at_its_first_step_starts_as_a_fresh_adam() -> None:
    model, language = tiny_lm()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
    reference = copy.deepcopy(model)
    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2, fused=True)
    backward(model, language)
    with skip_on_device(optimizer, torch.tensor(1.0)):
        optimizer.step()
    assert all(float(s["step"]) == 0.0 for s in optimizer.state.values())
    batch = language.batch(8, 17)
    for m, opt in ((model, optimizer), (reference, ref_optimizer)):
        on_batch(m, batch)
        opt.step()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)


def test_which_optimizers_skip_on_the_device() -> None:
    model, language = tiny_lm()
    params = list(model.parameters())
    assert skips_on_device(torch.optim.AdamW(params, fused=True))
    assert skips_on_device(torch.optim.SGD(params, lr=0.1, fused=True))
    assert not skips_on_device(torch.optim.AdamW(params))
    assert not skips_on_device(torch.optim.AdamW(params, foreach=True))
    assert not skips_on_device(torch.optim.Adagrad(params, fused=True))
    sgd = torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True)
    assert not skips_on_device(sgd)  # its first step makes the momentum buffers
    backward(model, language)
    sgd.step()
    assert skips_on_device(sgd)


@pytest.mark.parametrize("max_norm", [1e-3, 0.05, 0.3, 1e3])
def test_the_device_clip_equals_clip_grad_norm_bit_for_bit(max_norm: float) -> None:
    model, language = tiny_lm()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    for _ in range(3):
        backward(model, language, scale=5.0)
        reference = copy.deepcopy(model)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            q.grad = None if p.grad is None else p.grad.clone()
        norm = global_norm(model)
        coef = clip_coefficients(norm, max_norm)
        # the host path's coefficient, from the same norm read on the host
        assert coef.item() == clip_coefficient(norm.item(), max_norm)
        scale_on_device([p.grad for p in model.parameters() if p.grad is not None], coef)
        theirs = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm)
        assert torch.equal(norm, theirs)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None
            assert torch.equal(p.grad, q.grad)
        optimizer.step()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_nonfinite_norm_is_flagged_and_leaves_the_gradients_alone(bad: float) -> None:
    norm = torch.tensor(bad)
    assert nonfinite_flag(norm).item() == 1.0
    assert clip_coefficients(norm, 0.1).item() == 1.0
    grads = [torch.tensor([1.0, 2.0])]
    scale_on_device(grads, clip_coefficients(norm, 0.1))
    assert torch.equal(grads[0], torch.tensor([1.0, 2.0]))


def test_a_nonfinite_loss_is_flagged_with_finite_gradients() -> None:
    for bad in (math.nan, math.inf, -math.inf):
        assert nonfinite_flag(torch.tensor(3.0), torch.tensor(bad)).item() == 1.0
    assert nonfinite_flag(torch.tensor(3.0e38), torch.tensor(3.0e38)).item() == 0.0
    assert nonfinite_flag(torch.tensor(3.0), torch.tensor(2.0)).item() == 0.0
    assert nonfinite_flag(torch.tensor(3.0)).dtype == torch.float32
