"""The report in a real headless Chromium: it loads with no JavaScript error, fetches nothing
(the page's content policy would refuse it, and the page counts refusals as errors) and draws
every plot. Skipped when no chromium binary is found (`make test` installs it as root)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainguard.report import write_report

from .helpers import (
    NO_CHROMIUM,
    Opened,
    Synthetic,
    chromium_binary,
    console_messages,
    open_in_chromium,
)

pytestmark = pytest.mark.skipif(chromium_binary() is None, reason=NO_CHROMIUM)


def assert_drawn(opened: Opened, plots: int) -> None:
    status = opened.status
    assert status, "the report's status element is in the page"
    assert status["data-errors"] == "0", status["text"]
    assert status["data-state"] == "done", status
    assert status["data-plots"] == status["data-expected"] == str(plots), status
    assert console_messages(opened.stderr) == []
    title = re.search(r"<title>(.*?)</title>", opened.dom, re.S)
    assert title and title.group(1).endswith(f"\u2014 {plots}/{plots} plots")
    assert opened.dom.count('class="main-svg"') >= plots, "plotly drew an svg per plot"


def test_the_report_draws_every_plot_without_errors(small_run: Synthetic,
                                                    tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    written = write_report(small_run.run_dir, out)
    opened = open_in_chromium(out)
    assert_drawn(opened, written.plots)
    assert written.plots == 10
    assert int(opened.status["data-traces"]) >= 40, "lines, marks, events, shading, heat maps"
    assert opened.dom.count("<image") >= 7, "each heat map drew its image"


def test_a_hostile_store_runs_no_code_in_the_page(hostile_run: Synthetic,
                                                  tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    written = write_report(hostile_run.run_dir, out)
    opened = open_in_chromium(out)
    assert_drawn(opened, written.plots)
    root = re.search(r"<html[^>]*>", opened.dom)
    assert root and "pwned" not in root.group(0), "no injected script or handler ran"
    main = re.search(r"<main>(.*)</main>", opened.dom, re.S)
    assert main and "<img" not in main.group(1), "no injected element in the tables"


@pytest.mark.slow
def test_a_100k_step_500_parameter_report_renders_quickly(big_report: Path) -> None:
    opened = open_in_chromium(big_report, budget_ms=60000)
    assert_drawn(opened, 10)
    drawn_ms = int(opened.status["data-ms"])
    print(f"\n100k x 500 report: {big_report.stat().st_size / 1e6:.2f} MB, drawn in "
          f"{drawn_ms} ms in the page, {opened.seconds:.1f} s for Chromium in all")
    assert drawn_ms < 20_000
