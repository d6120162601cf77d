"""The output-side precursor signals in a guarded run: log Z rides the transfer of every step the
precursor's cadence measures, the update RMS only when `update_rms` asks for it, and closing the
run takes the log Z hook off the model."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch import nn

from trainguard import DetectorConfig, Guard, GuardConfig
from trainguard.detect.instability_precursor import InstabilityPrecursor
from trainguard.signals import StepSignals


def run(monkeypatch: pytest.MonkeyPatch, steps: int = 3,
        **detectors: object) -> tuple[list[dict], nn.Module]:
    seen: list[dict] = []
    check = InstabilityPrecursor.check

    def recording(self: InstabilityPrecursor, signals: StepSignals) -> list:
        seen.append({k: np.asarray(v) for k, v in signals.precursors.items()})
        return check(self, signals)

    monkeypatch.setattr(InstabilityPrecursor, "check", recording)
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = Guard(model, optimizer, config=GuardConfig(
        detectors=DetectorConfig(instability_precursor=detectors), sinks={"console": False}))  # type: ignore[arg-type]
    x = torch.randn(6, 4)
    for _ in range(steps):
        loss = model(x).logsumexp(-1).mean()
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad()
    guard.close()
    return seen, model


def test_log_z_every_step_and_no_update_rms_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    seen, model = run(monkeypatch, every=1)
    assert len(seen) == 3 and all({"logz_mean", "logz_max"} <= set(s) for s in seen)
    assert all("adam_update_rms" not in s for s in seen)
    assert seen[0]["logz_max"].shape == (1,)
    assert not model._forward_hooks  # closed: the hook is gone


def test_the_update_rms_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    seen, _ = run(monkeypatch, update_rms=True, every=1)
    assert all(s["adam_update_rms"].shape == (2,) for s in seen)
    assert (seen[-1]["adam_update_rms"] > 0).all()  # Adam state from the steps before


def test_no_precursor_probe_no_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    seen, _ = run(monkeypatch, probe=False)
    assert all(s == {} for s in seen)


def test_the_cadence_measures_the_first_step_and_then_every_few(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """By default the probes measure the first step, then (far from every bound) every
    `every` steps; the steps in between carry no precursor values."""
    seen, _ = run(monkeypatch, steps=40, every=4)
    measured = [step for step, s in enumerate(seen) if s]
    assert measured[0] == 0 and {"logz_max", "adam_ratio_rms"} <= set(seen[0])
    assert 10 <= len(measured) < 40
    assert all(later - earlier <= 4 for earlier, later in itertools.pairwise(measured))
