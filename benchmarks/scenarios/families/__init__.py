"""One module per model family; each exposes `scenarios() -> list[Scenario]`."""

from __future__ import annotations

import importlib
from types import ModuleType

_NAMES = ("gpt2", "gpt2_regression", "bert_cls", "image_cls", "diffusion", "diffusers_sd", "lstm",
          "regression", "mlp_cls", "ddp", "tiny_lm", "tiny_attn", "logit_growth", "rlhf")


def _load() -> list[ModuleType]:
    modules = []
    for name in _NAMES:
        try:
            modules.append(importlib.import_module(f"{__name__}.{name}"))
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    return modules


FAMILIES: list[ModuleType] = _load()
