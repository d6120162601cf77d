"""The console: a live progress line on a terminal (redrawn a few times a second, not every
step), plain lines elsewhere, no second progress bar under a trainer, the verdict at the end."""

from __future__ import annotations

import io
import math

import torch
from torch import nn

from trainguard import Guard, GuardConfig
from trainguard.events import RunInfo, StepReport
from trainguard.sinks import ConsoleSink


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(stream: io.StringIO, steps: int = 30, nan_at: int | None = 10, **console) -> Guard:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = Guard(model, optimizer, config=GuardConfig(console=False, preflight=False),
                  sinks=[ConsoleSink(stream, **console)])
    for step in range(steps):
        loss = model(torch.randn(8, 4)).square().mean()
        if step == nan_at:
            loss = loss * math.nan
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    return guard


def test_a_terminal_gets_a_live_line_and_the_events_above_it() -> None:
    out = Terminal()
    run(out, refresh_per_second=1000.0)
    text = out.getvalue()
    assert "trainguard  step" in text and "skipped 1" in text
    assert "nonfinite_loss" in text


def test_a_pipe_gets_plain_lines_only() -> None:
    out = io.StringIO()
    run(out)
    text = out.getvalue()
    assert "\033[" not in text and "trainguard  step" not in text
    assert text.splitlines() and all(line.startswith("trainguard") for line in text.splitlines())


def test_no_live_line_under_a_trainer_that_draws_its_own() -> None:
    out = Terminal()
    sink = ConsoleSink(out)
    sink.on_run_start(RunInfo(run_dir=None, config={}, param_names=[], param_shapes=[],
                              trainguard_version="x", integration="hf"))
    sink.on_step(StepReport(step=0, loss=1.0, grad_norm=1.0, action="applied"))
    sink.close()
    assert "trainguard  step" not in out.getvalue()


def test_the_line_is_redrawn_a_few_times_a_second_not_every_step(monkeypatch) -> None:
    out = Terminal()
    sink = ConsoleSink(out, refresh_per_second=4.0)
    sink.on_run_start(RunInfo(run_dir=None, config={}, param_names=[], param_shapes=[],
                              trainguard_version="x"))
    assert sink._line is not None
    draws = []
    original = sink._line.update
    monkeypatch.setattr(sink._line, "update", lambda *a, **k: (draws.append(1),
                                                              original(*a, **k)))
    for step in range(2000):
        sink.on_step(StepReport(step=step, loss=1.0, grad_norm=1.0, action="applied"))
    sink.close()
    assert 1 <= len(draws) <= 10


def test_turned_off_it_says_nothing(capsys) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = Guard(model, optimizer, config=GuardConfig(console=False))
    loss = model(torch.randn(8, 4)).square().mean() * math.nan
    loss.backward()
    guard.step(loss)
    guard.close()
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
