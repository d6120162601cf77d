"""The step's pack: what adding a segment costs, and several scalars added in one piece."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainguard.probes.packing import DevicePack


class _Calls(TorchDispatchMode):
    """Every operator call made while it is active (a real dispatch mode, nothing replaced)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_adding_a_flat_tensor_outside_autograd_calls_no_operator() -> None:
    norms, loss_like = torch.rand(76), torch.rand(1)
    pack = DevicePack(torch.device("cpu"))
    with _Calls() as calls:
        pack.add("param_grad_norm", norms)
        pack.add("loss", loss_like)
    assert calls.names == []
    host = pack.fetch()
    np.testing.assert_array_equal(host["param_grad_norm"], norms.double().numpy())
    np.testing.assert_array_equal(host["loss"], loss_like.double().numpy())


def test_a_tensor_in_autograd_or_of_other_shape_is_flattened_and_detached() -> None:
    weight = torch.ones(2, 3, requires_grad=True)
    pack = DevicePack(torch.device("cpu"))
    pack.add("w", weight * 2)
    pack.add("scalar", torch.tensor(math.nan))
    host = pack.fetch()
    np.testing.assert_array_equal(host["w"], np.full(6, 2.0))
    assert host["scalar"].shape == (1,) and math.isnan(host["scalar"][0])
