"""What the framework callbacks share: the optimizer inside trainer wrappers, config checks."""

from __future__ import annotations

import subprocess
import sys

import pytest
from accelerate import Accelerator
from lightning.pytorch.core.optimizer import LightningOptimizer

from trainguard import GuardConfig, UsageError
from trainguard.integrations.callback_state import callback_config, unwrap_optimizer

from ..conftest import lambda_setup


def test_unwrap_optimizer_finds_the_torch_optimizer_inside_framework_wrappers(
        fresh_accelerate: None) -> None:
    optimizer, _ = lambda_setup()
    assert unwrap_optimizer(optimizer) is optimizer
    prepared = Accelerator(cpu=True).prepare(optimizer)
    assert prepared is not optimizer
    assert unwrap_optimizer(prepared) is optimizer
    assert unwrap_optimizer(LightningOptimizer(optimizer)) is optimizer
    with pytest.raises(UsageError, match=r"torch\.optim\.Optimizer"):
        unwrap_optimizer(object())


def test_callback_config_validates() -> None:
    assert callback_config(None) == GuardConfig()
    config = GuardConfig(policy="halt")
    assert callback_config(config) is config
    with pytest.raises(UsageError, match="GuardConfig"):
        callback_config({"policy": "halt"})
    recover = GuardConfig(policy="recover")
    assert callback_config(recover) is recover  # rollbacks work under a trainer too


def test_importing_the_integrations_package_imports_no_framework() -> None:
    code = ("import sys, trainguard.integrations; "
            "print(sorted(m for m in ('transformers', 'lightning', 'pytorch_lightning') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"
