"""What the framework callbacks share besides `trainguard.driver.StepDriver`: finding the torch
optimizer inside a trainer's wrappers, and validating the config a callback is given."""

from __future__ import annotations

from typing import Any

import torch

from trainguard.config import GuardConfig
from trainguard.errors import UsageError


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside framework wrappers (accelerate's AcceleratedOptimizer,
    Lightning's LightningOptimizer), whose `state` and `param_groups` are the real ones."""
    for _ in range(8):  # wrappers nest at most a couple of levels; never loop forever
        inner = getattr(optimizer, "optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer) or inner is optimizer:
            break
        optimizer = inner
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(f"the trainer's optimizer must be a torch.optim.Optimizer, got "
                         f"{type(optimizer).__name__}")
    return optimizer


def callback_config(config: Any) -> GuardConfig:
    """The config given to a framework callback, validated when the callback is built."""
    if config is None:
        return GuardConfig()
    if not isinstance(config, GuardConfig):
        raise UsageError(f"config must be a trainguard.GuardConfig, got {type(config).__name__}")
    return config
