"""The journal is run state: a checkpoint keeps the findings a diagnosis weighs, not the events,
which are the sinks' record."""

from __future__ import annotations

import json

import torch

from trainguard.events import Event
from trainguard.finding import Finding
from trainguard.pipeline.journal import Journal
from trainguard.sinks import SinkSet


def _finding(check: str) -> Finding:
    return Finding(check=check, severity="warning", message=f"{check} looks off",
                   fix="lower it", cause="lr_too_high", evidence={"lr": 0.5, "names": ["w"]})


def test_a_checkpoint_keeps_the_findings_and_not_the_events() -> None:
    journal = Journal(SinkSet([]))
    journal.add_findings([_finding("lr_range"), _finding("layer_init")])
    journal.emit_event(Event(kind="loss_spike", step=3, severity="warning", message="spike"))
    state = json.loads(json.dumps(journal.state_dict()))  # plain types
    resumed = Journal(SinkSet([]))
    resumed.add_findings([_finding("warmup")])  # a resumed job's own preflight is replaced
    resumed.load_state_dict(state)
    assert resumed.findings == journal.findings
    assert resumed.events == []


def test_an_unreadable_finding_is_left_out_and_an_old_checkpoint_loads() -> None:
    journal = Journal(SinkSet([]))
    journal.load_state_dict({"findings": [{"check": "lr_range"}, "noise",
                                          _finding("lr_range").to_dict()]})
    assert [f.check for f in journal.findings] == ["lr_range"]
    journal.load_state_dict({})  # a checkpoint from before the journal kept state
    assert [f.check for f in journal.findings] == ["lr_range"]


def test_a_coupled_decay_told_before_a_resume_is_not_measured_again() -> None:
    journal = Journal(SinkSet([]))
    journal.add_findings([_finding("weight_decay_coupled")])
    model = torch.nn.Linear(4, 2)
    model(torch.randn(8, 4)).sum().backward()
    optimizer = torch.optim.Adam(model.parameters(), weight_decay=10.0)
    assert journal.observe_coupled_decay([optimizer], 0) == []
    assert journal.coupled_decay.done and journal.coupled_decay.medians == []
