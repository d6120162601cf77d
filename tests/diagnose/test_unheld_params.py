"""`unheld_params`: trainable parameters whose gradients no optimizer applies."""

from __future__ import annotations

import torch
from torch import nn

from trainguard import Guard, GuardConfig
from trainguard.diagnose.unheld_params import UnheldParams
from trainguard.params import watched_params


def test_the_set_ups_own_are_an_info_and_a_late_unfreezing_a_warning_each_said_once() -> None:
    model = nn.ModuleDict({"student": nn.Linear(4, 2), "teacher": nn.Linear(4, 2),
                           "embed": nn.Linear(4, 4)})
    model["embed"].requires_grad_(False)
    optimizer = torch.optim.SGD(model["student"].parameters(), lr=0.1)
    watched = watched_params(model, [optimizer])
    check = UnheldParams()
    assert check.check(model, watched, 0) == []  # no gradient yet: nothing is said
    x = torch.randn(8, 4)
    (model["student"](x).sum() + model["teacher"](x).sum()).backward()
    [info] = check.check(model, watched, 1)
    assert (info.severity, info.evidence["params"]) == ("info", ["teacher.weight", "teacher.bias"])
    model["embed"].requires_grad_(True)
    model["student"](model["embed"](x)).sum().backward()
    [warning] = check.check(model, watched, 50)
    assert warning.severity == "warning" and warning.check == "unheld_params"
    assert warning.evidence == {"params": ["embed.weight", "embed.bias"], "step": 50}
    assert "add_param_group" in warning.fix
    assert check.check(model, watched, 100) == []


def test_a_layer_unfrozen_after_the_optimizer_was_built_is_named_and_the_verdict_unmoved() -> None:
    """A newcomer's loop builds the optimizer from the trainable parameters, then unfreezes the
    body at step 20: its gradients are computed and never applied."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))
    model[0].requires_grad_(False)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    x_all = torch.randn(512, 16)
    y_all = (x_all[:, :4] * 3).argmax(1)
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False}))
    for step in range(60):
        if step == 20:
            model[0].requires_grad_(True)
        i = torch.randint(0, 512, (32,))
        loss = nn.functional.cross_entropy(model(x_all[i]), y_all[i])
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    [unheld] = [f for f in guard.findings if f.check == "unheld_params"]
    assert unheld.severity == "warning"
    assert unheld.evidence == {"params": ["0.weight", "0.bias"], "step": 50}  # sampled step
    assert guard.verdict is not None and guard.verdict.verdict == "healthy"
