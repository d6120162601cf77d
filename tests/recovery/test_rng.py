"""A rollback restores what its run owns, not the process's random number generators."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from trainguard import RecoveryConfig
from trainguard.recovery.state import capture

from .helpers import make_workload, recover_guard


def _draws() -> tuple[float, float, float]:
    """One draw from each process-wide generator."""
    return torch.randn(()).item(), float(np.random.rand()), random.random()


def _two_runs(*, fault: bool, restore_rng: bool = False) -> tuple[list[object], list[str]]:
    """Two models in one process, each with its own Guard under `recover`; the first one's loss
    is NaN for three steps when `fault` (it rolls back). Returns what the second one drew and lost
    after each step, and the first one's actions."""
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    first, second = make_workload(seed=1), make_workload(seed=2)  # dropout: they draw from torch
    torch.manual_seed(0)
    guard_first = recover_guard(first, rollback_after_skips=3, restore_rng=restore_rng)
    guard_second = recover_guard(second)
    seen: list[object] = []
    actions = []
    for step in range(40):
        loss = first.loss(first.batch(step))
        if fault and step in (25, 26, 27):
            loss = loss * math.nan
        loss.backward()
        actions.append(guard_first.step(loss).action)
        first.optimizer.zero_grad(set_to_none=True)

        noise = torch.randn(32, 8)  # the second run's own data augmentation, say
        batch = second.batch(step)
        batch = {"x": batch["x"] + 0.01 * noise, "y": batch["y"]}
        loss = second.loss(batch)
        loss.backward()
        report = guard_second.step(loss)
        second.optimizer.zero_grad(set_to_none=True)
        seen.append((report.loss, _draws()))
    guard_first.close()
    guard_second.close()
    return seen, actions


def test_a_rollback_leaves_another_runs_random_stream_as_it_was() -> None:
    plain, plain_actions = _two_runs(fault=False)
    rolled, actions = _two_runs(fault=True)
    assert "rolled_back" in actions and "rolled_back" not in plain_actions
    assert rolled == plain  # bit for bit: the second run's losses and every later draw


def test_restore_rng_puts_the_generators_back_when_asked() -> None:
    plain, _ = _two_runs(fault=False)
    rolled, actions = _two_runs(fault=True, restore_rng=True)
    assert "rolled_back" in actions
    rolled_at = actions.index("rolled_back")
    assert rolled[:rolled_at] == plain[:rolled_at]
    # from the rollback on, the second run draws again what it drew after the restored state
    assert rolled[rolled_at:] != plain[rolled_at:]


def test_the_good_states_keep_rng_states_only_when_a_rollback_is_to_restore_them() -> None:
    for restore_rng in (False, True):
        w = make_workload()
        guard = recover_guard(w, restore_rng=restore_rng)
        state = guard.recovery.ring.good[0]
        assert (state.rng is not None) is restore_rng
        guard.close()
    w = make_workload()
    saved = capture(step=0, model=w.model, optimizers=[w.optimizer], scheduler=w.scheduler,
                    scaler=None, guard_state={})
    assert saved.rng is not None  # the default of the function itself


def test_restore_rng_must_be_a_flag() -> None:
    from trainguard import ConfigError

    with pytest.raises(ConfigError, match=r"^recovery\.restore_rng"):
        RecoveryConfig(restore_rng="no")  # type: ignore[arg-type]
