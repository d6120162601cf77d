"""Conformance over every probe: what each must keep, whatever it measures.

Each probe measures on the device and hands back tensors; none reads a value on the host (no
transfer, no `.item()`), a NaN or inf in what it measures shows in its output instead of being
hidden, and its results are one value per watched parameter (or per hooked module), in order.
Which keys are registered, with which scope, is `tests/test_registry.py`'s check.

The probes are found by importing every module of `trainguard.probes`: every class named
`...Probe` must be in `MEASURED` or `HOOKED` below, so a new probe cannot be left out.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from torch import nn

import trainguard.probes
from trainguard.params import WatchedParams, watched_params
from trainguard.probes.activations import ActivationProbe
from trainguard.probes.adam_ratio import AdamRatioProbe
from trainguard.probes.attention_logits import AttentionLogitProbe
from trainguard.probes.diffusion_target import CHECK_STEPS, DiffusionTargetProbe
from trainguard.probes.gradients import GradientProbe
from trainguard.probes.logz import LogZProbe
from trainguard.probes.optimizer_state import OptimizerStateProbe
from trainguard.probes.outputs import OUTPUT_KEYS, OutputProbe
from trainguard.probes.packing import DevicePack
from trainguard.probes.samples import SampleProbe
from trainguard.probes.weights import WeightProbe
from trainguard.transfer import transfer_count

CPU = torch.device("cpu")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.inp(x)))


def setup() -> tuple[Net, torch.optim.Optimizer, WatchedParams]:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(6, 4)).square().mean().backward()
    optimizer.step()  # Adam state exists
    return model, optimizer, watched_params(model, [optimizer])


@contextmanager
def no_host_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any `.item()`, `.tolist()` or transfer inside the block fails the test."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a probe read a value on the host")

    before = transfer_count()
    with monkeypatch.context() as patch:
        for name in ("item", "tolist", "__float__", "__bool__"):
            patch.setattr(torch.Tensor, name, refuse)
        yield
    assert transfer_count() == before


def measure_gradients(model: Net, optimizer: torch.optim.Optimizer,
                      watched: WatchedParams) -> dict[str, torch.Tensor]:
    pack = DevicePack(CPU)
    GradientProbe(watched).measure(pack, CPU)
    return {k: torch.from_numpy(v) for k, v in pack.fetch().items()}


def measure_weights(model: Net, optimizer: torch.optim.Optimizer,
                    watched: WatchedParams) -> dict[str, torch.Tensor]:
    probe = WeightProbe(watched)
    probe.remember()
    return probe.measure(CPU)


def measure_optimizer_state(model: Net, optimizer: torch.optim.Optimizer,
                            watched: WatchedParams) -> dict[str, torch.Tensor]:
    return OptimizerStateProbe(watched, [optimizer]).measure(CPU)


def measure_adam_ratio(model: Net, optimizer: torch.optim.Optimizer,
                       watched: WatchedParams) -> dict[str, torch.Tensor]:
    return AdamRatioProbe(watched, [optimizer], updates=True).measure(CPU)


PROBES: dict[str, Callable[..., dict[str, torch.Tensor]]] = {
    "gradients": measure_gradients, "weights": measure_weights,
    "optimizer_state": measure_optimizer_state, "adam_ratio": measure_adam_ratio}
MEASURED: dict[type, str] = {GradientProbe: "gradients", WeightProbe: "weights",
                             OptimizerStateProbe: "optimizer_state",
                             AdamRatioProbe: "adam_ratio"}
"""Probes that measure the watched parameters, by their entry in PROBES."""
HOOKED: tuple[type, ...] = (ActivationProbe, OutputProbe, AttentionLogitProbe)
"""Probes hooked on the forward pass of sampled steps: attach, forward, detach."""
PERSISTENT: tuple[type, ...] = (LogZProbe,)
"""Probes hooked on every forward pass for the life of the run: forward, take, close."""
FIRST_STEPS: tuple[type, ...] = (DiffusionTargetProbe,)
"""Probes hooked from the start for the first steps only, then off for good."""
CALLED: tuple[type, ...] = (SampleProbe,)
"""Probes that call the user's function off the step on their own cadence (checked below, and
in `tests/probes/test_samples.py`)."""


class Attending(nn.Module):
    """One attention layer's q|k|v projection, which the attention probe hooks."""

    num_heads = 2
    is_causal = True

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(4, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.qkv(x)


def hooked_model(probe_type: type) -> tuple[nn.Module, torch.Tensor]:
    """The model a hooked probe watches, and an input for it."""
    if probe_type is AttentionLogitProbe:  # it hooks attention layers only
        torch.manual_seed(0)
        return Attending(), torch.randn(2, 5, 4)
    return setup()[0], torch.randn(5, 4)


def probe_classes() -> set[type]:
    """Every class named `...Probe` defined in a module of `trainguard.probes`."""
    found: set[type] = set()
    for info in pkgutil.walk_packages(trainguard.probes.__path__, "trainguard.probes."):
        module = importlib.import_module(info.name)
        found |= {value for name, value in vars(module).items()
                  if isinstance(value, type) and value.__module__ == info.name
                  and name.endswith("Probe")}
    return found


def test_every_probe_is_under_these_checks() -> None:
    found = probe_classes()
    assert {GradientProbe, ActivationProbe, OutputProbe} <= found
    unknown = (found - set(MEASURED) - set(HOOKED) - set(PERSISTENT) - set(CALLED)
               - set(FIRST_STEPS))
    assert not unknown, (f"probes under no check: {sorted(c.__name__ for c in unknown)}; add "
                         "each to MEASURED (with a measure function in PROBES), HOOKED, CALLED, "
                         "FIRST_STEPS or PERSISTENT")
    assert set(MEASURED.values()) == set(PROBES)


@pytest.mark.parametrize("probe_type", HOOKED, ids=[t.__name__ for t in HOOKED])
def test_hooked_probes_read_nothing_on_the_host_and_remove_their_hooks(
        probe_type: type, monkeypatch) -> None:
    model, inputs = hooked_model(probe_type)
    probe = probe_type(model)
    with no_host_reads(monkeypatch):
        probe.attach()
        model(inputs)
        seen = probe.detach()
    assert seen is not None and not probe.attached
    assert all(not m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("probe_type", PERSISTENT, ids=[t.__name__ for t in PERSISTENT])
def test_persistent_probes_read_nothing_on_the_host_and_remove_their_hooks(
        probe_type: type, monkeypatch) -> None:
    model, _, _ = setup()
    probe = probe_type(model)
    with no_host_reads(monkeypatch):
        model(torch.randn(5, 4))
        seen = probe.take()
    assert seen is not None and seen.device == CPU and seen.dtype == torch.float32
    assert probe.take() is None  # each forward's values are taken once
    probe.close()
    assert all(not m._forward_hooks for m in model.modules())


class Denoiser(nn.Module):
    """A module whose forward takes a timestep, as a diffusion model's does."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        return self.conv(sample)


def test_first_step_probes_read_nothing_on_the_host_and_come_off(monkeypatch) -> None:
    diffusers = pytest.importorskip("diffusers")
    scheduler = diffusers.DDPMScheduler(num_train_timesteps=10)
    model = Denoiser()
    probe = DiffusionTargetProbe(scheduler, model)
    for _ in range(CHECK_STEPS):
        with no_host_reads(monkeypatch):
            clean = torch.randn(2, 3, 4, 4)
            model(scheduler.add_noise(clean, torch.randn_like(clean), torch.tensor([1, 7])),
                  torch.tensor([1, 7]))
            seen = probe.take()
        assert seen is not None and seen.shape == (3,) and seen.dtype == torch.float32
    assert not probe.attached and "add_noise" not in vars(scheduler)
    assert all(not m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("name", ["weights", "optimizer_state", "adam_ratio"])
def test_device_probes_read_nothing_on_the_host(name: str, monkeypatch) -> None:
    model, optimizer, watched = setup()
    with no_host_reads(monkeypatch):
        out = PROBES[name](model, optimizer, watched)
    for key, values in out.items():
        assert values.shape == (len(watched),), key
        assert values.device == CPU and values.dtype == torch.float32, key


def test_the_gradient_probe_only_adds_to_the_pack(monkeypatch) -> None:
    _, _, watched = setup()
    pack = DevicePack(CPU)
    with no_host_reads(monkeypatch):
        GradientProbe(watched).measure(pack, CPU)
    assert pack


def test_the_activation_probe_reads_nothing_on_the_host(monkeypatch) -> None:
    model, _, _ = setup()
    probe = ActivationProbe(model)
    with no_host_reads(monkeypatch):
        probe.attach()
        model(torch.randn(5, 4))
        seen = probe.detach()
    assert seen is not None and probe.failures == 0
    names, table = seen
    assert names == ["inp", "act", "out"]
    assert all(v.shape == (3,) for v in table.values())


def poison(model: Net, optimizer: torch.optim.Optimizer, value: float) -> None:
    """One entry of `inp.weight` (its value, gradient and Adam moments) set to `value`."""
    with torch.no_grad():
        weight = model.inp.weight
        weight[0, 0] = value
        weight.grad[0, 0] = value
        for state in optimizer.state[weight].values():
            if isinstance(state, torch.Tensor) and state.shape == weight.shape:
                state[0, 0] = value


@pytest.mark.parametrize("name", list(PROBES))
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_nonfinite_value_shows_in_every_probe(name: str, bad: float) -> None:
    model, optimizer, watched = setup()
    poison(model, optimizer, bad)
    out = PROBES[name](model, optimizer, watched)
    index = watched.names.index("inp.weight")
    for key, values in out.items():
        if values.numel() == 1:  # a per-step value (the global gradient norm, the fp16 max)
            assert not math.isfinite(float(values)), key
            continue
        row = values.numpy()
        if key == "weight_nonfinite":
            assert row[index] == 1.0 and (np.delete(row, index) == 0.0).all()
        elif key == "update_ratio":
            continue  # the copy from before holds the same bad value; nothing moved
        else:
            assert not np.isfinite(row[index]), key
            assert np.isfinite(np.delete(row, index)).all(), key


def test_a_nonfinite_activation_shows_in_the_activation_probe() -> None:
    model, _, _ = setup()
    probe = ActivationProbe(model)
    probe.attach()
    model(torch.tensor([[math.nan, 0.0, 0.0, 0.0]] + [[1.0, 2.0, 3.0, 4.0]] * 3))
    seen = probe.detach()
    assert seen is not None
    names, table = seen
    nonfinite = dict(zip(names, table["act_nonfinite"].tolist(), strict=True))
    assert nonfinite["inp"] == pytest.approx(8 / 32)  # the first row of 4 x 8 outputs
    assert not math.isfinite(float(table["act_maxabs"][names.index("inp")]))


def test_a_nonfinite_output_shows_in_the_output_probe() -> None:
    model, _, _ = setup()
    probe = OutputProbe(model)
    probe.attach()
    model(torch.tensor([[math.nan, 0.0, 0.0, 0.0]] + [[1.0, 2.0, 3.0, 4.0]] * 3))
    seen = probe.detach()
    assert seen is not None and set(seen) == set(OUTPUT_KEYS)
    assert not math.isfinite(float(seen["out_std"]))
    assert float(seen["out_count"]) == 4 and float(seen["out_classes"]) == 3


def test_a_nonfinite_value_shows_in_the_attention_probe() -> None:
    model, inputs = hooked_model(AttentionLogitProbe)
    inputs[0, 2, 1] = math.inf  # the sampled sequence
    probe = AttentionLogitProbe(model)
    probe.attach()
    model(inputs)
    seen = probe.detach()
    assert seen is not None and not math.isfinite(float(seen[1][0]))


def test_parameters_without_a_gradient_read_zero_not_nan() -> None:
    model, optimizer, watched = setup()
    model.out.weight.grad = None
    out = measure_gradients(model, optimizer, watched)
    norms = out["param_grad_norm"].numpy()
    assert norms[watched.names.index("out.weight")] == 0.0
    assert np.isfinite(norms).all() and math.isfinite(float(out["grad_norm"]))
    ratios = measure_adam_ratio(model, optimizer, watched)["adam_ratio_rms"].numpy()
    assert ratios[watched.names.index("out.weight")] == 0.0 and np.isfinite(ratios).all()


def test_a_step_without_any_gradient_measures_zeros() -> None:
    model, optimizer, watched = setup()
    optimizer.zero_grad(set_to_none=True)
    out = measure_gradients(model, optimizer, watched)
    assert float(out["grad_norm"]) == 0.0 and (out["param_grad_norm"] == 0).all()


@pytest.mark.parametrize("probe_type", HOOKED, ids=[t.__name__ for t in HOOKED])
def test_detaching_without_a_forward_pass_gives_nothing_and_removes_the_hooks(
        probe_type: type) -> None:
    model, _ = hooked_model(probe_type)
    probe = probe_type(model)
    probe.attach()
    assert probe.attached
    assert probe.detach() is None and not probe.attached
    assert all(not m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("probe_type", CALLED, ids=[t.__name__ for t in CALLED])
def test_a_called_probe_survives_its_function_and_gives_the_model_back_as_it_was(
        probe_type: type) -> None:
    model = nn.Linear(4, 4)
    for fn in (lambda m: torch.full((2, 3, 4, 4), math.nan), lambda m: 1 / 0):
        probe = probe_type(fn, 10, 0.02)
        stats = probe.take(model, 0)
        assert model.training and probe.calls == 1
        assert stats is None or stats.nonfinite == 1.0
