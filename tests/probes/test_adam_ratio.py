"""The Adam ratio probe against values computed by hand from the optimizer state."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from torch import nn

from trainguard.params import watched_params
from trainguard.probes.adam_ratio import AdamRatioProbe, _Rows, _step_counts
from trainguard.probes.gradients import GradientProbe
from trainguard.probes.packing import DevicePack

CPU = torch.device("cpu")


def model_and_adam(betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-6,
                   steps: int = 3, kind: type = torch.optim.AdamW,
                   **options: bool) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    optimizer = kind(model.parameters(), lr=1e-2, betas=betas, eps=eps, **options)
    for _ in range(steps):
        model(torch.randn(5, 3)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    model(torch.randn(5, 3)).square().mean().backward()  # the step about to be taken
    return model, optimizer


def by_hand(param: torch.Tensor, state: dict, beta2: float, eps: float) -> float:
    """sqrt(sum g^2 / sum v_hat), v_hat = (v + eps^2) / (1 - beta2^t), element by element."""
    steps = int(state["step"])
    squares = sum(g * g for g in param.grad.flatten().tolist())
    moments = sum((v + eps * eps) / (1 - beta2 ** steps)
                  for v in state["exp_avg_sq"].flatten().tolist())
    return math.sqrt(squares / moments)


def variants() -> list[tuple[type, dict[str, bool]]]:
    """Adam and AdamW, for-loop, foreach and (where this build has it on the CPU) fused."""
    found: list[tuple[type, dict[str, bool]]] = []
    for kind in (torch.optim.Adam, torch.optim.AdamW):
        found += [(kind, {"foreach": False}), (kind, {"foreach": True})]
        try:
            kind([nn.Parameter(torch.zeros(1))], fused=True)
        except (RuntimeError, ValueError):
            continue
        found.append((kind, {"fused": True}))
    return found


@pytest.mark.parametrize("beta2,eps", [(0.95, 1e-6), (0.999, 1e-8)])
@pytest.mark.parametrize("kind,options", variants(),
                         ids=lambda v: v.__name__ if isinstance(v, type) else str(v))
def test_each_parameter_against_the_hand_computed_ratio(beta2: float, eps: float, kind: type,
                                                        options: dict[str, bool]) -> None:
    model, optimizer = model_and_adam((0.9, beta2), eps, kind=kind, **options)
    watched = watched_params(model, [optimizer])
    out = AdamRatioProbe(watched, [optimizer]).measure(CPU)["adam_ratio_rms"]
    assert out.shape == (4,)
    for name, param, value in zip(watched.names, watched.params, out.tolist(), strict=True):
        assert value == pytest.approx(by_hand(param, optimizer.state[param], beta2, eps),
                                      rel=1e-5), name


def test_the_gradient_norms_the_step_computed_give_the_same_values() -> None:
    model, optimizer = model_and_adam()
    watched = watched_params(model, [optimizer])
    pack = DevicePack(CPU)
    _, _, norms, _ = GradientProbe(watched).measure(pack, CPU)
    probe = AdamRatioProbe(watched, [optimizer])
    assert torch.allclose(probe.measure(CPU, norms)["adam_ratio_rms"],
                          probe.measure(CPU)["adam_ratio_rms"])


def test_a_gradient_far_above_the_second_moment_reads_far_above_one() -> None:
    model, optimizer = model_and_adam()
    watched = watched_params(model, [optimizer])
    before = AdamRatioProbe(watched, [optimizer]).measure(CPU)["adam_ratio_rms"]
    with torch.no_grad():
        model[2].weight.grad.mul_(10.0)
    after = AdamRatioProbe(watched, [optimizer]).measure(CPU)["adam_ratio_rms"]
    index = watched.names.index("2.weight")
    assert after[index] == pytest.approx(10 * before[index], rel=1e-5)
    assert torch.equal(torch.cat([after[:index], after[index + 1:]]),
                       torch.cat([before[:index], before[index + 1:]]))


def test_no_adam_state_or_no_adam_reads_zero() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    adam = torch.optim.Adam(model.parameters())
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    for optimizer in (adam, sgd):  # Adam before its first step; SGD has no second moment
        sgd.step()
        watched = watched_params(model, [optimizer])
        out = AdamRatioProbe(watched, [optimizer]).measure(CPU)["adam_ratio_rms"]
        assert out.tolist() == [0.0, 0.0]


def update_by_hand(state: dict, beta1: float, beta2: float, eps: float) -> float:
    """sqrt(sum m_hat^2 / sum v_hat), m_hat = m / (1 - beta1^t), element by element."""
    steps = int(state["step"])
    firsts = sum((m / (1 - beta1 ** steps)) ** 2 for m in state["exp_avg"].flatten().tolist())
    moments = sum((v + eps * eps) / (1 - beta2 ** steps)
                  for v in state["exp_avg_sq"].flatten().tolist())
    return math.sqrt(firsts / moments)


@pytest.mark.parametrize("beta2,eps", [(0.95, 1e-6), (0.999, 1e-8)])
@pytest.mark.parametrize("kind,options", variants(),
                         ids=lambda v: v.__name__ if isinstance(v, type) else str(v))
def test_the_update_rms_against_the_hand_computed_value(beta2: float, eps: float, kind: type,
                                                        options: dict[str, bool]) -> None:
    model, optimizer = model_and_adam((0.8, beta2), eps, kind=kind, **options)
    watched = watched_params(model, [optimizer])
    out = AdamRatioProbe(watched, [optimizer], updates=True).measure(CPU)["adam_update_rms"]
    assert out.shape == (4,)
    for name, param, value in zip(watched.names, watched.params, out.tolist(), strict=True):
        assert value == pytest.approx(update_by_hand(optimizer.state[param], 0.8, beta2, eps),
                                      rel=1e-5), name


def test_the_update_rms_is_close_to_the_exact_one_when_v_is_even() -> None:
    """The proxy equals the element-wise RMS of m_hat / sqrt(v_hat) when v is uniform."""
    holder = nn.Linear(2, 3, bias=False)
    weight = holder.weight
    optimizer = torch.optim.Adam([weight], lr=1e-2, betas=(0.9, 0.99), eps=1e-12)
    signs = torch.tensor([[1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]])
    for _ in range(4):  # the same |g| everywhere: v uniform; m the same size too
        weight.grad = signs * 0.5
        optimizer.step()
    weight.grad = signs.clone()
    state = optimizer.state[weight]
    m_hat = state["exp_avg"] / (1 - 0.9 ** 4)
    v_hat = state["exp_avg_sq"] / (1 - 0.99 ** 4)
    exact = float((m_hat / v_hat.sqrt()).square().mean().sqrt())
    out = AdamRatioProbe(watched_params(holder, [optimizer]), [optimizer],
                         updates=True).measure(CPU)
    assert float(out["adam_update_rms"][0]) == pytest.approx(exact, rel=1e-5)
    assert exact == pytest.approx(1.0, rel=1e-5)  # a steady gradient: updates of the full LR


def carried_against_summed(kind: type, options: dict[str, bool], steps: int = 40,
                           upset: Any = None) -> list[float]:
    """The probe kept across steps (sum v carried by the recursion) against a fresh probe each
    step (sum v summed over the moments), as the largest relative difference per step;
    `upset(step, model, optimizer)` may change the run before each step's update."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    optimizer = kind(model.parameters(), lr=1e-2, betas=(0.9, 0.95), **options)
    watched = watched_params(model, [optimizer])
    kept = AdamRatioProbe(watched, [optimizer])
    differences = []
    for step in range(steps):
        optimizer.zero_grad()
        (model(torch.randn(5, 3)).square().mean() * (1 + step % 7)).backward()
        carried = kept.measure(CPU)["adam_ratio_rms"]
        summed = AdamRatioProbe(watched, [optimizer]).measure(CPU)["adam_ratio_rms"]
        differences.append(((carried - summed).abs() / summed.clamp(min=1e-12)).max().item())
        if upset is None or upset(step, model, optimizer):
            optimizer.step()
    kept.close()
    return differences


@pytest.mark.parametrize("kind,options", variants(),
                         ids=lambda v: v.__name__ if isinstance(v, type) else str(v))
def test_the_carried_second_moment_sum_matches_the_summed_one(
        kind: type, options: dict[str, bool]) -> None:
    assert max(carried_against_summed(kind, options)) < 1e-5


def test_the_carry_survives_clips_skips_rollbacks_and_double_steps() -> None:
    saved: dict[str, Any] = {}

    def upset(step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> bool:
        if step == 5:  # a clip after the measurement: the step is not the one measured
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        if step == 8:
            saved["state"] = copy.deepcopy(optimizer.state_dict())
        if step == 12:  # a rollback that loads the moments back
            optimizer.load_state_dict(saved["state"])
        if step == 15:  # the same moments written in place
            for state in optimizer.state.values():
                state["exp_avg_sq"].mul_(3.0)
        if step == 20:  # a second update on the same gradients
            optimizer.step()
        return step not in (25, 26)  # skipped steps

    assert max(carried_against_summed(torch.optim.AdamW, {"foreach": True},
                                      upset=upset)) < 1e-5


def test_an_optimizer_outside_the_recursion_sums_every_step() -> None:
    """Adam with L2 weight decay puts wd * w into the gradient v sees: summed, still exact."""
    assert max(carried_against_summed(torch.optim.Adam, {"weight_decay": 0.1})) < 1e-5


def assert_the_next_step_is_carried_exactly(model: nn.Module,
                                            optimizer: torch.optim.Optimizer,
                                            kept: AdamRatioProbe) -> None:
    """One more backward: `kept` carries sum v (no sum over the moments) and agrees with a
    fresh probe that sums them."""
    optimizer.zero_grad()
    model(torch.randn(5, 4)).square().mean().backward()
    carried = kept.measure(CPU)["adam_ratio_rms"]
    assert kept._carried is not None and kept._carried.age > 0  # carried, not summed
    summed = AdamRatioProbe(kept.watched, [optimizer]).measure(CPU)["adam_ratio_rms"]
    assert torch.allclose(carried, summed, rtol=1e-5)


def test_the_deferred_clip_on_the_device_carries_into_the_sum() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    watched = watched_params(model, [optimizer])
    kept = AdamRatioProbe(watched, [optimizer])
    for _ in range(6):
        optimizer.zero_grad()
        model(torch.randn(5, 4)).square().mean().backward()
        kept.measure(CPU)
        coef = torch.tensor(0.25)
        torch._foreach_mul_([p.grad for p in model.parameters()], coef)
        kept.scaled(coef)
        optimizer.step()
    assert_the_next_step_is_carried_exactly(model, optimizer, kept)


def test_closing_removes_the_hooks() -> None:
    model, optimizer = model_and_adam()
    probe = AdamRatioProbe(watched_params(model, [optimizer]), [optimizer])
    probe.measure(CPU)
    assert optimizer._optimizer_step_pre_hooks and optimizer._optimizer_step_post_hooks
    probe.close()
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks


def test_a_closure_that_measures_inside_the_step_is_carried_and_a_later_clip_is_seen() -> None:
    """Lightning measures inside the closure `optimizer.step(closure)` runs, after the step's
    pre-hook, and may clip after measuring: the carry must hold in the first case and give way
    to a sum in the second."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    watched = watched_params(model, [optimizer])
    kept = AdamRatioProbe(watched, [optimizer])
    worst, ages = 0.0, []

    for step in range(30):
        def closure(step: int = step) -> torch.Tensor:
            nonlocal worst
            optimizer.zero_grad()
            loss = model(torch.randn(5, 3)).square().mean() * (1 + step % 5)
            loss.backward()
            carried = kept.measure(CPU)["adam_ratio_rms"]
            ages.append(kept._carried.age if kept._carried is not None else -1)
            summed = AdamRatioProbe(watched, [optimizer]).measure(CPU)["adam_ratio_rms"]
            worst = max(worst, ((carried - summed).abs() / summed).max().item())
            if step % 7 == 3:  # a clip after the measurement
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
            return loss
        optimizer.step(closure)
    kept.close()
    assert worst < 1e-5
    assert max(ages) > 1  # carried over several steps, not summed every time
    assert [a for s, a in enumerate(ages) if s % 7 == 4 and s > 0] == [0] * 4  # summed after


def test_a_step_skipped_on_the_device_leaves_the_carried_sum_as_it_was() -> None:
    """`sync="deferred"` hands a fused optimizer `found_inf`: at 1 the kernel leaves v alone,
    and the carried sum must too."""
    try:
        torch.optim.AdamW([nn.Parameter(torch.zeros(1))], fused=True)
    except (RuntimeError, ValueError):
        pytest.skip("no fused AdamW on this device")
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    watched = watched_params(model, [optimizer])
    kept = AdamRatioProbe(watched, [optimizer])
    for step in range(8):
        optimizer.zero_grad()
        model(torch.randn(5, 4)).square().mean().backward()
        kept.measure(CPU)
        optimizer.found_inf = torch.tensor(1.0 if step in (4, 5) else 0.0)
        optimizer.grad_scale = None
        optimizer.step()
        del optimizer.found_inf, optimizer.grad_scale
    assert_the_next_step_is_carried_exactly(model, optimizer, kept)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fused", [False, True])
def test_measuring_on_cuda_never_waits_for_the_device(fused: bool) -> None:
    """Adam's step counts live on the host for most optimizers (on the device for fused ones):
    the bias corrections reach the device without a synchronisation (a plain copy from
    pageable memory would wait)."""
    torch.manual_seed(0)
    cuda = torch.device("cuda")
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).to(cuda)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    watched = watched_params(model, [optimizer])
    probe = AdamRatioProbe(watched, [optimizer], updates=True)
    for step in range(4):
        model(torch.randn(5, 3, device=cuda)).square().mean().backward()
        if step == 1:  # Adam's state exists: the rows' constants go to the device once
            probe.measure(cuda)
        elif step > 1:  # from then on nothing waits
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                probe.measure(cuda)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        optimizer.step()
        optimizer.zero_grad()
    probe.close()


@pytest.mark.parametrize("steps", [
    [torch.tensor(3.0), torch.tensor(7.0)],                          # Adam's own counts
    [torch.tensor(3.0), torch.tensor(7.0, dtype=torch.float64)],     # one of another dtype
    [torch.tensor(3.0), torch.tensor([7.0])],                        # one of another shape
    [torch.tensor(3.0), 7],                                          # a count kept as a number
    [torch.tensor(3, dtype=torch.int64), torch.tensor(7, dtype=torch.int64)],
])
def test_step_counts_read_alike_whatever_their_kind(steps: list[Any]) -> None:
    rows = _Rows(steps=steps)
    count = _step_counts(rows, torch.device("cpu"))
    assert count.dtype == torch.float32 and count.shape == (2,)
    assert count.tolist() == [3.0, 7.0]
