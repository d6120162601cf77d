"""AGC against a straightforward per-unit loop, on real models."""

from __future__ import annotations

import copy
import math
from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn

from trainguard.demo import MarkovLanguage, TinyCausalLM
from trainguard.errors import ConfigError, UsageError
from trainguard.remedies.agc import AGC, DEFAULT_EXCLUDE

from .helpers import measure


def small_cnn(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """Conv (4-D), linear (2-D), LayerNorm and biases (1-D), a classifier head; with gradients."""
    torch.manual_seed(seed)
    model = nn.Sequential(OrderedDict(
        conv=nn.Conv2d(3, 8, 3), act=nn.ReLU(), flat=nn.Flatten(), fc=nn.Linear(8 * 6 * 6, 16),
        norm=nn.LayerNorm(16), head=nn.Linear(16, 4))).to(dtype)
    x = torch.randn(8, 3, 8, 8).to(dtype)
    nn.functional.cross_entropy(model(x).float(), torch.randint(0, 4, (8,))).backward()
    return model


def reference_agc(weight: torch.Tensor, grad: torch.Tensor, clipping: float, eps: float,
                  unitwise: bool) -> torch.Tensor:
    """The paper's rule, one unit at a time, in float64."""
    w, g = weight.detach().double(), grad.double()
    units = range(w.shape[0]) if unitwise and w.ndim >= 2 else [...]
    out = g.clone()
    for unit in units:
        w_norm = max(w[unit].norm().item(), eps)
        g_norm = g[unit].norm().item()
        if g_norm / w_norm > clipping:
            out[unit] = g[unit] * (clipping * w_norm / g_norm)
    return out.to(grad.dtype)


def unit_ratios(weight: torch.Tensor, grad: torch.Tensor, eps: float) -> torch.Tensor:
    if weight.ndim < 2:
        return grad.norm().reshape(1) / weight.norm().clamp_min(eps)
    return grad.flatten(1).norm(dim=1) / weight.flatten(1).norm(dim=1).clamp_min(eps)


@pytest.mark.parametrize("unitwise", [True, False])
def test_agc_equals_the_per_unit_loop(unitwise: bool) -> None:
    model = small_cnn()
    names = [n for n, _ in model.named_parameters()]
    params = list(model.parameters())
    before = torch.cat([unit_ratios(p, p.grad, 1e-3) if unitwise
                        else unit_ratios(p.reshape(-1), p.grad.reshape(-1), 1e-3)
                        for p in params])
    assert (before > 1.0).any() and (before < 1.0).any()  # some units clip, some do not
    expected = [reference_agc(p, p.grad, 1.0, 1e-3, unitwise) for p in params]
    AGC(clipping=1.0, unitwise=unitwise, exclude=()).apply(params, names)
    for param, ref in zip(params, expected, strict=True):
        torch.testing.assert_close(param.grad, ref, rtol=1e-5, atol=1e-8)


def test_unitwise_mixes_clipped_and_untouched_rows() -> None:
    model = small_cnn()
    before = model.fc.weight.grad.clone()
    ratios = unit_ratios(model.fc.weight, before, 1e-3)
    assert (ratios > 1.0).any() and (ratios < 1.0).any()
    AGC(clipping=1.0, exclude=()).apply(list(model.parameters()),
                                        [n for n, _ in model.named_parameters()])
    after = model.fc.weight.grad
    assert torch.equal(after[ratios < 1.0], before[ratios < 1.0])
    clipped = ratios > 1.0
    torch.testing.assert_close(after[clipped].norm(dim=1),
                               model.fc.weight[clipped].detach().norm(dim=1), rtol=1e-5, atol=0)


def test_parameterwise_reuses_the_measured_norms() -> None:
    model = small_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = measure(model, optimizer, torch.tensor(1.0))
    computed = copy.deepcopy(model)
    for src, dst in zip(model.parameters(), computed.parameters(), strict=True):
        dst.grad = src.grad.clone()
    from_tensor = copy.deepcopy(computed)
    for src, dst in zip(model.parameters(), from_tensor.parameters(), strict=True):
        dst.grad = src.grad.clone()
    agc = AGC(clipping=1.0, unitwise=False, exclude=())
    agc.apply(seen.params, seen.names, grad_norms=seen.norms)
    agc.apply(list(computed.parameters()), seen.names)
    agc.apply(list(from_tensor.parameters()), seen.names,
              grad_norms=torch.as_tensor(seen.norms, dtype=torch.float32))
    for ours, again, third in zip(model.parameters(), computed.parameters(),
                                  from_tensor.parameters(), strict=True):
        torch.testing.assert_close(ours.grad, again.grad, rtol=1e-6, atol=0)
        torch.testing.assert_close(ours.grad, third.grad, rtol=1e-6, atol=0)


def test_given_norms_are_used_not_recomputed() -> None:
    model = small_cnn()
    params = list(model.parameters())
    names = [n for n, _ in model.named_parameters()]
    before = [p.grad.clone() for p in params]
    # tell AGC the gradients are tiny: nothing may be clipped
    AGC(clipping=1.0, unitwise=False, exclude=()).apply(params, names,
                                                        grad_norms=np.full(len(params), 1e-9))
    assert all(torch.equal(p.grad, b) for p, b in zip(params, before, strict=True))


def test_default_exclusions_and_the_classifier_head_are_left_alone() -> None:
    model = small_cnn()
    params = list(model.parameters())
    names = [n for n, _ in model.named_parameters()]
    before = {n: p.grad.clone() for n, p in zip(names, params, strict=True)}
    agc = AGC(clipping=1.0, exclude=(*DEFAULT_EXCLUDE, "head.*"))
    assert agc.included(names).tolist() == [n in ("conv.weight", "fc.weight") for n in names]
    agc.apply(params, names)
    for name, param in zip(names, params, strict=True):
        same = torch.equal(param.grad, before[name])
        assert same == (name not in ("conv.weight", "fc.weight")), name


def test_nonfinite_units_take_the_untouched_branch() -> None:
    model = small_cnn()
    grad = model.fc.weight.grad
    grad[0, 3] = math.nan
    grad[1, 5] = math.inf
    before = grad.clone()
    ratios = unit_ratios(model.fc.weight, before, 1e-3)[2:]
    AGC(clipping=1.0, exclude=()).apply([model.fc.weight], ["fc.weight"])
    assert torch.isnan(grad[0, 3]) and torch.isinf(grad[1, 5])  # never turned into 0 or NaN
    assert torch.equal(grad[0].nan_to_num(), before[0].nan_to_num())
    assert torch.equal(grad[1], before[1])
    assert not torch.isnan(grad[1]).any()
    assert (ratios > 1.0).any()
    assert not torch.equal(grad[2:], before[2:])  # the finite rows are still clipped


def test_eps_keeps_zero_initialised_weights_trainable() -> None:
    bias = nn.Parameter(torch.zeros(5))
    bias.grad = torch.full((5,), 2.0)
    AGC(clipping=0.01, eps=1e-3, exclude=()).apply([bias], ["bias"])
    assert bias.grad.norm().item() == pytest.approx(0.01 * 1e-3, rel=1e-5)


def test_bfloat16_parameters_are_clipped_in_their_dtype() -> None:
    model = small_cnn(dtype=torch.bfloat16)
    params = list(model.parameters())
    expected = [reference_agc(p, p.grad, 1.0, 1e-3, True) for p in params]
    AGC(clipping=1.0, exclude=()).apply(params, [n for n, _ in model.named_parameters()])
    for param, ref in zip(params, expected, strict=True):
        assert param.grad.dtype == torch.bfloat16
        torch.testing.assert_close(param.grad, ref, rtol=2e-2, atol=1e-6)


def test_every_unit_of_a_language_model_obeys_the_bound() -> None:
    torch.manual_seed(0)
    model = TinyCausalLM(vocab_size=32, d_model=32, n_layer=2, n_head=2, max_len=32)
    language = MarkovLanguage(32, seed=0)
    (model.loss(language.batch(8, 17)) * 100).backward()
    names = [n for n, _ in model.named_parameters()]
    params = list(model.parameters())
    agc = AGC(clipping=0.01, exclude=(*DEFAULT_EXCLUDE, "head.*"))
    before = [unit_ratios(p, p.grad, 1e-3) for p in params]
    agc.apply(params, names)
    included = agc.included(names)
    assert included.sum() >= 6 and not included[names.index("head.weight")]
    for keep, param, old in zip(included, params, before, strict=True):
        ratio = unit_ratios(param, param.grad, 1e-3)
        if keep:
            assert (old > 0.01).any() and (ratio <= 0.01 * (1 + 1e-5)).all()
        else:
            assert torch.equal(ratio, old)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_agc_never_syncs_with_the_host() -> None:
    model = small_cnn().cuda()
    params = list(model.parameters())
    names = [n for n, _ in model.named_parameters()]
    norms = np.array([p.grad.norm().item() for p in params], dtype=np.float32)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        AGC(clipping=1.0, exclude=()).apply(params, names)
        AGC(clipping=1.0, unitwise=False).apply(params, names)
        AGC(clipping=1.0, unitwise=False).apply(params, names, grad_norms=norms)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"clipping": 0.0}, "AGC.clipping: must be a finite number > 0"),
    ({"clipping": -0.01}, "AGC.clipping"),
    ({"eps": -1e-3}, "AGC.eps: must be a finite number > 0"),
    ({"unitwise": 1}, "AGC.unitwise: must be True or False"),
    ({"exclude": "*bias"}, "AGC.exclude: must be a sequence of non-empty name patterns"),
    ({"exclude": ("*bias", "")}, "AGC.exclude"),
])
def test_bad_arguments_are_config_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AGC(**kwargs)


def test_mismatched_inputs_are_usage_errors() -> None:
    model = small_cnn()
    params = list(model.parameters())
    with pytest.raises(UsageError, match="8 parameters but 1 names"):
        AGC().apply(params, ["conv.weight"])
    with pytest.raises(UsageError, match="2 gradient norms for 8 parameters"):
        AGC(unitwise=False).apply(params, [n for n, _ in model.named_parameters()],
                                  grad_norms=np.ones(2))
