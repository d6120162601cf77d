"""The `record` stage: what the sinks hear of a step, in step order."""

from __future__ import annotations

from pathlib import Path

import torch

from trainguard import Guard, GuardConfig
from trainguard.demo import MarkovLanguage, TinyCausalLM
from trainguard.events import Event, StepReport
from trainguard.sinks import Sink
from trainguard.store import RunReader


class Heard(Sink):
    """Each event with the step whose record stage told it (the next report's step)."""

    def __init__(self) -> None:
        self.pending: list[Event] = []
        self.heard: list[tuple[int, Event]] = []
        self.reported: list[int] = []
        """The steps of the events in the step reports, in their order."""

    def on_event(self, event: Event) -> None:
        self.pending.append(event)

    def on_step(self, report: StepReport) -> None:
        self.heard += [(report.step, event) for event in self.pending]
        self.reported += [event.step for event in report.events]
        self.pending = []


def exploding_run(run_dir: Path) -> tuple[Heard, list[Event]]:
    """The demo's broken run: AdamW at LR 1 without warmup. Its first update is measured by the
    heavy probes at the next step (an `update_too_large` of step 0, detected at step 1), where
    the loss jumps too (a `loss_spike` of step 1)."""
    torch.manual_seed(0)
    language = MarkovLanguage(seed=0)
    model = TinyCausalLM(vocab_size=language.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0, weight_decay=0.01)
    heard = Heard()
    guard = Guard(model, optimizer, config=GuardConfig(policy="observe", sinks={"console": False}),
                  run_dir=run_dir, sinks=[heard])
    with guard:
        for _ in range(4):
            batch = language.batch(16, 33)
            loss = model.loss(batch)
            loss.backward()
            guard.step(loss, batch={"input_ids": batch})
            optimizer.zero_grad(set_to_none=True)
    return heard, list(guard.events)


def test_events_detected_a_step_late_are_heard_in_step_order(tmp_path: Path) -> None:
    heard, events = exploding_run(tmp_path)
    late = [(at, e.kind, e.step) for at, e in heard.heard if e.step < at]
    assert late, f"the run detects no event of an earlier step: {heard.heard}"
    told = [e.step for _, e in heard.heard]
    assert told == sorted(told), [(e.step, e.kind) for _, e in heard.heard]
    assert heard.reported == told
    assert [e.step for e in events] == sorted(e.step for e in events)
    with RunReader(tmp_path) as reader:
        assert [e.step for e in reader.events()] == sorted(told)

