"""The base policy (`pipeline/policy.py`) as a loop meets it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from trainguard.events import Event
from trainguard.pipeline.policy import Decision


def test_observe_under_a_grad_scaler_is_bit_identical_to_the_plain_loop(tmp_path: Path) -> None:
    """A step whose loss itself is not finite (inputs x1e36) overflows the scaled gradients:
    `scaler.step` skips it without trainguard, so `observe` must too (it once applied the NaN
    update and left non-finite weights)."""
    import torch
    from torch import nn

    import trainguard

    def run(guarded: bool) -> tuple[list[torch.Tensor], float]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
        generator = torch.Generator().manual_seed(1)
        guard = (trainguard.Guard(model, optimizer, scaler=scaler, run_dir=tmp_path / "run",
                                  config=trainguard.GuardConfig(policy="observe",
                                                                sinks={"console": False}))
                 if guarded else None)
        for step in range(40):
            x = torch.randn(16, 8, generator=generator)
            if step == 20:
                x = x * 1e36
            loss = nn.functional.mse_loss(model(x), x[:, :1])
            scaler.scale(loss).backward()
            if guard is not None:
                guard.step(loss)
            else:
                scaler.step(optimizer)
                scaler.update()
            optimizer.zero_grad(set_to_none=True)
        if guard is not None:
            guard.close()
        return [p.detach().clone() for p in model.parameters()], scaler.get_scale()

    plain, plain_scale = run(False)
    guarded, guarded_scale = run(True)
    assert guarded_scale == plain_scale
    assert all(torch.equal(a, b) for a, b in zip(plain, guarded, strict=True))
    assert all(torch.isfinite(p).all() for p in guarded)


def test_a_decision_with_its_clip_is_the_decision_with_those_two_fields_replaced() -> None:
    """`Decision.with_clip` builds the decision field by field: every other field, set here to a
    value of its own, comes through as `dataclasses.replace` carries it."""
    given = {"action": "rolled_back", "clip_coef": 0.5, "reason": "why",
             "events": (Event(kind="skip_limit", step=3, severity="critical", message="m"),),
             "verdict": object(), "instead_of": "skipped", "clip_limit": 9.0,
             "clip_alarm": "precursor"}
    assert {f.name for f in dataclasses.fields(Decision)} == set(given)
    decision = Decision(**given)  # type: ignore[arg-type]
    assert decision.with_clip(2.0, "trouble") == dataclasses.replace(
        decision, clip_limit=2.0, clip_alarm="trouble")
    assert decision.with_clip(None, None) == dataclasses.replace(
        decision, clip_limit=None, clip_alarm=None)


def test_protect_halts_at_once_when_the_weights_themselves_are_non_finite(
        tmp_path: Path) -> None:
    """A model loaded in float16 and trained with AdamW at its defaults: the first update's
    second moments underflow, m / (sqrt(v) + eps) overflows and the weights go to inf. Every
    step from there is non-finite, and no skipped update brings the weights back: `protect`
    halts at the first step that shows them (it used to skip 25 steps first); `recover` is left
    to roll back."""
    import pytest
    import torch
    from torch import nn

    import trainguard
    from trainguard.errors import TrainingDiverged

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4)).half()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = trainguard.Guard(model, optimizer, run_dir=tmp_path / "run",
                             config=trainguard.GuardConfig(sinks={"console": False}))
    x = torch.randn(64, 8).half()
    y = torch.randint(0, 4, (64,))
    with pytest.raises(TrainingDiverged) as info:
        for _ in range(40):
            loss = nn.functional.cross_entropy(model(x).float(), y)
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad(set_to_none=True)
    halted = info.value.events
    assert any(e.kind == "nonfinite_weight" for e in halted)
    assert any(e.kind == "skip_limit" and "non-finite weights" in e.message for e in halted)
    assert guard.global_step <= 3
    assert guard.diagnose()[0].code in ("fp16_overflow", "optimizer_eps")
