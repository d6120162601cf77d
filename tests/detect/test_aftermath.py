"""A precursor at or after the trouble it foretells is told as that trouble's aftermath."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import trainguard
from trainguard.detect.aftermath import AHEAD, STEPS, Aftermath, is_trouble
from trainguard.events import Event


def _precursor(step: int) -> Event:
    return Event("instability_precursor", step, "warning",
                 f"log Z of the output logits at 30, up from 5 before them{AHEAD}~15 steps")


@pytest.mark.parametrize(("kind", "severity", "trouble"), [
    ("loss_spike", "info", False),  # a one-step outlier until the next step shows harm
    ("loss_spike", "error", True),
    ("grad_explosion", "error", True),
    ("loss_divergence", "error", True),
    ("bad_start", "warning", True),
    ("nonfinite_loss", "error", True),
    ("nonfinite_grad", "error", True),
    ("nonfinite_metric", "warning", False),  # a trainer's metric, not the loss or gradients
    ("update_too_large", "warning", False),  # the weights moved far, the loss not yet
    ("lr_change", "info", False),
    ("instability_precursor", "warning", False),
])
def test_what_counts_as_trouble(kind: str, severity: str, trouble: bool) -> None:
    assert is_trouble(Event(kind, 3, severity, "m")) is trouble  # type: ignore[arg-type]


def test_a_precursor_before_any_trouble_stays_a_warning() -> None:
    told = Aftermath().tell([_precursor(10)])
    assert told[0].severity == "warning" and AHEAD in told[0].message


def test_a_precursor_after_a_spike_is_its_aftermath_for_a_while() -> None:
    aftermath = Aftermath()
    spike = Event("loss_spike", 100, "error", "loss jumped")
    same = aftermath.tell([spike, _precursor(100)])
    assert same[0] is spike and same[1].severity == "info"
    assert "this step's loss_spike" in same[1].message and AHEAD not in same[1].message
    later = aftermath.tell([_precursor(100 + STEPS - 1)])[0]
    assert later.severity == "info" and "the loss_spike of step 100" in later.message
    assert later.details["aftermath_step"] == 100
    assert aftermath.tell([_precursor(100 + STEPS)])[0].severity == "warning"


def test_a_precursor_told_late_from_before_the_trouble_stays_a_warning() -> None:
    # a calm row's event comes at the next full step, ahead of that step's own events
    told = Aftermath().tell([_precursor(40), Event("grad_explosion", 41, "error", "norm")])
    assert told[0].severity == "warning"


def test_each_precursor_is_told_after_the_latest_trouble_before_it() -> None:
    """Rows told late hold several troubles: a precursor after the first, one after the second,
    and one before both, in the order the detectors raised them."""
    told = Aftermath().tell([_precursor(10), Event("loss_divergence", 11, "error", "up"),
                             _precursor(12), Event("grad_explosion", 40, "error", "norm"),
                             _precursor(41), _precursor(40)])
    assert [e.severity for e in told if e.kind == "instability_precursor"] == [
        "warning", "info", "info", "info"]
    assert [e.details.get("aftermath_step") for e in told
            if e.kind == "instability_precursor"] == [None, 11, 40, 40]


def test_the_window_survives_a_checkpoint() -> None:
    aftermath = Aftermath()
    aftermath.tell([Event("loss_divergence", 7, "error", "up")])
    again = Aftermath()
    again.load_state_dict(aftermath.state_dict())
    assert again.tell([_precursor(9)])[0].severity == "info"


def test_a_loop_that_raises_its_lr_gets_no_precursor_warning_after_the_spike() -> None:
    """The user's own code puts the LR at 1000x mid-run: the spike is an error, and the logits
    that grow with the damage afterwards are no warning of a spike to come."""
    torch.manual_seed(0)
    x_all = torch.randn(1024, 20)
    y_all = (x_all @ torch.randn(20, 5)).argmax(1)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 5))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = trainguard.Guard(model, optimizer, config=trainguard.GuardConfig(policy="observe"))
    events: list[Event] = []
    for step in range(170):
        index = torch.randint(0, 1024, (32,))
        if step == 150:
            for group in optimizer.param_groups:
                group["lr"] = 1.0
        loss = nn.functional.cross_entropy(model(x_all[index]), y_all[index])
        loss.backward()
        events += guard.step(loss, batch=(x_all[index], y_all[index])).events
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    first = min(e.step for e in events if is_trouble(e))
    assert 150 <= first <= 152
    after = [e for e in events if e.kind == "instability_precursor" and e.step >= first]
    assert after, "the logits still grow after the spike: told, as its aftermath"
    assert all(e.severity == "info" and "part of that trouble" in e.message for e in after)
