"""A loop that raises its LR x100 and divides it back by 100 while recovery holds a cut on it
divides the cut too: the run is told so, where it trained on at 1/12 of the LR the loop meant
without a word; the LR is never put above what the loop wrote."""

from __future__ import annotations

import torch
from torch import nn

from trainguard import Guard, GuardConfig

from ..conftest import Actions


def _run(undo: str) -> tuple[list[float], Actions]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    weights = torch.randn(20, 4, generator=generator)
    actions = Actions()
    guard = Guard(model, optimizer, config=GuardConfig(policy="recover",
                                                       sinks={"console": False}),
                  sinks=[actions])
    lrs = []
    for step in range(140):
        group = optimizer.param_groups[0]
        if step == 100:
            group["lr"] *= 100
        if step == 110:
            if undo == "scaled":
                group["lr"] /= 100
            else:
                group["lr"] = 1e-3
        x = torch.randn(32, 20, generator=generator)
        loss = nn.functional.cross_entropy(model(x), (x @ weights).argmax(1))
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
        lrs.append(group["lr"])
    guard.close()
    return lrs, actions


def test_a_cut_lr_the_loop_scales_is_told_and_a_written_one_is_followed() -> None:
    scaled_lrs, scaled = _run("scaled")
    told = [a for a in scaled.actions if a.kind == "lr_change" and a.details.get(
        "written_by_loop")]
    rollback = next(a for a in scaled.actions if a.kind == "rollback")
    assert 100 <= rollback.step <= 105
    # the adaptive clip's limit is no typical norm: it clips what is abnormal for the run
    assert "clipping a step whose norm is abnormal for this run (above" in rollback.message
    assert len(told) == 1 and told[0].step == 110, [a.message for a in scaled.actions]
    assert "x0.01 the schedule is 0.001" in told[0].message
    assert max(scaled_lrs[110:]) <= 1e-3 / 10  # as written: never raised above it
    written_lrs, written = _run("written")
    assert not any(a.details.get("written_by_loop") for a in written.actions)
    assert written_lrs[-1] == 1e-3
