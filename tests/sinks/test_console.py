"""The console: a live progress line on a terminal (redrawn a few times a second, not every
step), plain lines elsewhere, no second progress bar under a trainer, the verdict at the end."""

from __future__ import annotations

import io
import math
import re
from collections import Counter

import torch
from torch import nn

from trainguard import Guard, GuardConfig
from trainguard.events import Event, RunInfo, StepReport
from trainguard.sinks import ConsoleSink
from trainguard.sinks.console import REPEAT_QUIET

from ..conftest import make_setup


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(stream: io.StringIO, steps: int = 30, nan_at: int | None = 10, **console) -> Guard:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False},
                                                       probes={"preflight": False}),
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
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False}))
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
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False},
                                                       probes={"preflight": False}),
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
    assert "[step 10] ERROR nonfinite_loss: loss is nan" in text
    assert "[steps 11-21] ERROR nonfinite_loss x11 more" in text, "every NaN step is counted"
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
    sink.on_event(warning(120, severity="error"))  # more severe: its own line
    sink.on_event(warning(160))  # 50 steps after the last one: the count, then printed
    sink.on_event(warning(170))  # counted, and said at the end
    sink.on_run_end("finished")
    assert out.getvalue().splitlines() == [
        "trainguard [step 100] WARNING instability_precursor: logit at step 100",
        "trainguard [step 104] WARNING instability_precursor: logit at step 104",
        "trainguard [step 120] ERROR instability_precursor: logit at step 120",
        "trainguard [steps 103-110] WARNING instability_precursor on h.0.attn x3 more (repeats "
        "of the one printed; guard.events and `trainguard show` list each)",
        "trainguard [step 160] WARNING instability_precursor: logit at step 160",
        "trainguard [step 170] WARNING instability_precursor on h.0.attn x1 more (repeats of "
        "the one printed; guard.events and `trainguard show` list each)"]


def nan_weights_run(out: io.StringIO, steps: int = 56, nan_from: int | None = 10) -> Guard:
    """A small transformer whose weights are made NaN mid-run, under observe: from then on the
    same four errors come at every step (loss, gradients, weights, optimizer state)."""
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer,
                  config=GuardConfig(policy="observe", sinks={"console": False},
                                     probes={"preflight": False}),
                  sinks=[ConsoleSink(out)])
    for step in range(steps):
        if step == nan_from:
            with torch.no_grad():
                setup.model.tok.weight.fill_(math.nan)
        loss = setup.model.loss(setup.batch())
        loss.backward()
        guard.step(loss)
        setup.optimizer.zero_grad(set_to_none=True)
    guard.close()
    return guard


def test_repeated_errors_are_summed_up_not_printed_at_every_step() -> None:
    """This run printed 187 lines (39 KB) for its 184 events, out of step order; now 11."""
    out = io.StringIO()
    guard = nan_weights_run(out)
    lines = out.getvalue().splitlines()
    kinds = Counter(e.kind for e in guard.events)
    assert set(kinds) == {"nonfinite_loss", "nonfinite_grad", "nonfinite_weight",
                          "nonfinite_optimizer_state"}, kinds
    for kind, count in kinds.items():
        full = [line for line in lines if f"] ERROR {kind}:" in line]
        counted = [int(m.group(1)) for line in lines
                   if (m := re.search(rf"\] ERROR {kind}(?: on \S+)? x(\d+) more", line))]
        assert len(full) == 1 and 1 + sum(counted) == count, (kind, full, counted)
    assert len(lines) <= len(kinds) * 2 + 4, "\n".join(lines)  # the causes lines, the verdict
    told = [int(m.group(1)) for line in lines if (m := re.match(r"trainguard \[steps? (\d+)",
                                                                line))]
    assert told == sorted(told), "\n".join(lines)


def test_a_long_stretch_of_repeats_is_said_once_per_window() -> None:
    out = io.StringIO()
    nan_weights_run(out, steps=10 + 2 * REPEAT_QUIET + 5)
    said = re.findall(r"\[steps (\d+)-(\d+)\] ERROR nonfinite_loss x(\d+) more", out.getvalue())
    assert said == [("11", "60", "50"), ("61", "110", "50"), ("111", "114", "4")], said


def test_a_healthy_run_prints_nothing() -> None:
    out = io.StringIO()
    nan_weights_run(out, steps=30, nan_from=None)
    assert out.getvalue() == ""


class _CutOff(nn.Module):
    """A two-layer net whose second layer's output is detached: the first layer never learns."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(4, 16), nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x).relu().detach())


def _lines_of_a_run_with_a_finding_at_its_first_step(preflight: bool) -> list[str]:
    torch.manual_seed(0)
    model = _CutOff()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    out = io.StringIO()
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False},
                                                       probes={"preflight": preflight}),
                  sinks=[ConsoleSink(out)])
    for _ in range(60):  # the check's last step is the first sampled one (50)
        loss = model(torch.randn(8, 4)).square().mean()
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    return [line for line in out.getvalue().splitlines() if "unreached_params" in line]


def test_a_finding_of_the_first_steps_is_labelled_a_check_not_the_preflight() -> None:
    for preflight in (True, False):
        lines = _lines_of_a_run_with_a_finding_at_its_first_step(preflight)
        assert lines and all(line.startswith("trainguard check ") for line in lines), lines


def test_an_lr_change_trainguard_makes_is_printed_unless_its_rollback_said_it() -> None:
    from trainguard.events import ActionRecord

    out = io.StringIO()
    sink = ConsoleSink(out)
    sink.on_action(ActionRecord("lr_change", 138, "LR x0.5 ahead of a likely loss spike"))
    sink.on_action(ActionRecord("rollback", 150, "rolled back to step 140, LR x0.05 ramping"))
    sink.on_action(ActionRecord("lr_change", 150, "LR x0.05 after the rollback, ramping back"))
    text = out.getvalue()
    assert "LR x0.5 ahead of a likely loss spike" in text
    assert "after the rollback" not in text
