"""The cost of a calm guarded step, pinned by structure rather than by a clock: the Python calls
trainguard's own code makes per step on a small healthy run (a count that a loaded machine does
not move, where a timed test would be flaky)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch import nn

import trainguard
from trainguard import Guard, GuardConfig

PACKAGE = str(Path(trainguard.__file__).parent)

CALLS_PER_STEP_BOUND = 660
"""The calls trainguard's code may make on an unsampled or sampled step of the healthy MLP run
below, on average (about 632 when this bound was set: the stages, the detectors, the precursor
probes on their cadence). A change that adds per-step work on every step moves the average past
it; the optimizer's own calls, made on trainguard's behalf, are not counted."""


def _calls_per_step(guard: Guard, step: Any, steps: int) -> float:
    """Average calls per step made from a frame of trainguard's code (Python functions and C
    builtins alike) while `step` runs."""
    counted = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal counted
        if event == "c_call":
            caller = frame
        elif event == "call":
            caller = frame.f_back
        else:
            return
        if caller is not None and caller.f_code.co_filename.startswith(PACKAGE):
            counted += 1

    for _ in range(steps):
        sys.setprofile(profile)
        try:
            step()
        finally:
            sys.setprofile(None)
    return counted / steps


def test_a_calm_step_stays_under_its_call_budget() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False}))
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 32, generator=generator),
                torch.randint(0, 4, (16,), generator=generator)) for _ in range(8)]
    position = 0

    def step() -> None:
        nonlocal position
        x, y = batches[position % len(batches)]
        position += 1
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)

    for _ in range(60):  # past the detectors' warm-up: the steady state is what is pinned
        step()
    calls = _calls_per_step(guard, step, 96)  # a multiple of the probes' cadences
    guard.close()
    assert guard.events == []  # a calm run: the count is of calm steps
    assert 0 < calls <= CALLS_PER_STEP_BOUND, calls
