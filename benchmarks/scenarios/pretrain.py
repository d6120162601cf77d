"""Pre-trained starting points for the fine-tuning scenarios, trained once and cached.

Fine-tuning starts from a model that already knows something, so each family first trains its
base model briefly on a related task. The weights are cached in memory and on disk
(`benchmarks/.cache/`, ignored by git), keyed by the family's own key, and loaded with
`torch.load(weights_only=True)`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

CACHE_DIR = Path(os.environ.get("TRAINGUARD_SCENARIO_CACHE",
                                Path(__file__).resolve().parents[1] / ".cache"))
_memory: dict[str, dict[str, torch.Tensor]] = {}


def pretrained(key: str, model: nn.Module, train: Callable[[nn.Module], None]) -> nn.Module:
    """Load the cached weights for `key` into `model`, training them with `train` the first time.

    `key` must change whenever the architecture or the pre-training recipe changes.
    """
    state = _memory.get(key)
    path = CACHE_DIR / f"{key}.pt"
    if state is None and path.is_file():
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # a stale or broken cache is simply rebuilt
            state = None
    if state is None:
        generator_state = torch.get_rng_state()
        threads = torch.get_num_threads()
        mode = {name: m.training for name, m in model.named_modules()}
        trainable = {name: p.requires_grad for name, p in model.named_parameters()}
        torch.set_num_threads(1)  # the weights must not depend on the machine's thread count
        try:
            train(model)
        finally:
            torch.set_num_threads(threads)
            torch.set_rng_state(generator_state)
            # The model must leave as a cache load leaves it: no pre-training grads (a first
            # backward would add to them), the same modes and trainable flags.
            model.zero_grad(set_to_none=True)
            for name, m in model.named_modules():
                m.train(mode[name])
            for name, p in model.named_parameters():
                p.requires_grad_(trainable[name])
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # processes that build at once
        torch.save(state, tmp)
        os.replace(tmp, path)
    _memory[key] = state
    model.load_state_dict(state)
    return model
