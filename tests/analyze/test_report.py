"""The HTML report of an analysed log: built from what the log holds, NaN rows drawn as marks,
strings from the log escaped, and drawn without errors in a real headless Chromium."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("plotly")

from trainguard.analyze import analyze
from trainguard.analyze.report import log_run_data
from trainguard.report.output import write_data_report

from ..report.helpers import NO_CHROMIUM, chromium_binary, console_messages, open_in_chromium
from .logs import trainer_state


def test_the_log_becomes_the_reports_run_data(tmp_path: Path) -> None:
    result = analyze(trainer_state(tmp_path / "trainer_state.json", blow_up_at=300))
    data = log_run_data(result)
    assert data.steps.tolist() == [10 * i for i in range(1, 61)]
    assert int(math.isnan(data.loss.values[-1])) == 1 and not data.loss.missing[-1]
    assert data.meta["verdict"]["verdict"] == "degraded"
    assert data.meta["diagnosis"][0]["code"] == result.causes[0].code
    assert [e.kind for e in data.events] == [e.kind for e in result.events]
    assert data.grads.empty, "a trainer_state.json holds no per-parameter norms"


def test_strings_from_the_log_are_escaped(tmp_path: Path) -> None:
    hostile = tmp_path / "<img src=x onerror=alert(1)>"
    hostile.mkdir()
    path = trainer_state(hostile / "trainer_state.json", blow_up_at=300)
    out = tmp_path / "r.html"
    write_data_report(log_run_data(analyze(path)), out)
    html = out.read_text()
    assert "<img src=x" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html, "the path is shown, escaped"


@pytest.mark.skipif(chromium_binary() is None, reason=NO_CHROMIUM)
def test_the_report_of_a_diverged_log_draws_in_chromium(tmp_path: Path) -> None:
    result = analyze(trainer_state(tmp_path / "trainer_state.json", blow_up_at=300))
    out = tmp_path / "r.html"
    written = write_data_report(log_run_data(result), out)
    assert written.plots >= 3, "loss, learning rate and gradient norm"
    opened = open_in_chromium(out)
    status = opened.status
    assert status["data-errors"] == "0", status["text"]
    assert status["data-state"] == "done"
    assert status["data-plots"] == status["data-expected"] == str(written.plots)
    assert console_messages(opened.stderr) == []
    assert "non-finite" in opened.dom or "NaN" in opened.dom, "the NaN rows are marked"
