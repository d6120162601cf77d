"""The console: a live progress line on a terminal (redrawn a few times a second, not every
step), plain lines elsewhere, no second progress bar under a trainer, the verdict at the end."""

from __future__ import annotations

import io
import math

import torch
from torch import nn

from trainguard import Guard, GuardConfig
from trainguard.events import Event, RunInfo, StepReport
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


def causes_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("trainguard likely causes")]


def test_an_incident_prints_its_likely_causes_once_not_every_step() -> None:
    out = io.StringIO()
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = Guard(model, optimizer, config=GuardConfig(console=False, preflight=False),
                  sinks=[ConsoleSink(out)])
    for step in range(30):
        loss = model(torch.randn(8, 4)).square().mean()
        if 10 <= step < 22:  # twelve NaN steps in a row
            loss = loss * math.nan
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    text = out.getvalue()
    assert text.count("nonfinite_loss") >= 12, "every NaN step is still reported"
    assert len(causes_lines(text)) == 1, text


def test_the_causes_line_is_printed_again_when_the_ranking_changes() -> None:
    out = io.StringIO()
    sink = ConsoleSink(out)

    def event(step: int, *codes: str, confidence: float = 0.5) -> Event:
        return Event(kind="nonfinite_loss", step=step, severity="error", message="loss is nan",
                     details={"likely_causes": [{"code": c, "confidence": confidence}
                                                for c in codes]})

    sink.on_event(event(1, "numerical_op", "nonfinite_input"))
    sink.on_event(event(2, "numerical_op", "nonfinite_input", confidence=0.6))  # same ranking
    sink.on_event(event(3, "nonfinite_input", "numerical_op"))  # the order changed
    sink.on_event(event(4, "nonfinite_input", "numerical_op", "lr_too_high"))  # a new cause
    sink.on_event(event(5, "nonfinite_input", "numerical_op", "lr_too_high"))
    lines = causes_lines(out.getvalue())
    assert [line.split(":")[1].split(". Fix")[0].strip() for line in lines] == [
        "numerical_op 50%, nonfinite_input 50%", "nonfinite_input 50%, numerical_op 50%",
        "nonfinite_input 50%, numerical_op 50%, lr_too_high 50%"]


def test_a_warning_that_repeats_is_counted_not_printed_again() -> None:
    out = io.StringIO()
    sink = ConsoleSink(out)

    def warning(step: int, param: str = "h.0.attn", severity: str = "warning") -> Event:
        return Event(kind="instability_precursor", step=step, severity=severity,
                     message=f"logit at step {step}", param=param)

    for step in (100, 103, 106, 110):  # a signal that re-warns as it keeps growing
        sink.on_event(warning(step))
    sink.on_event(warning(104, param="h.1.attn"))  # another layer: its own line
    sink.on_event(warning(120, severity="error"))  # errors always print
    sink.on_event(warning(160))  # 50 steps after the last one printed: printed, with the count
    sink.on_event(warning(170))  # held, and said at the end
    sink.on_run_end("finished")
    lines = out.getvalue().splitlines()
    assert [line for line in lines if "logit at step" in line] == [
        "trainguard [step 100] WARNING instability_precursor: logit at step 100",
        "trainguard [step 104] WARNING instability_precursor: logit at step 104",
        "trainguard [step 120] ERROR instability_precursor: logit at step 120",
        "trainguard [step 160] WARNING instability_precursor: logit at step 160 "
        "(3 more like it after step 100 not shown)"]
    assert lines[-1].startswith("trainguard: 1 repeated warning(s) not shown")
