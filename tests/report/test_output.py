"""The size of a long run's report: a 100k-step run with 500 parameters gives a page of a few MB
(plotly.js itself is about 4.8 MB of it), with every event and every non-finite value kept."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from trainguard.report import write_report
from trainguard.report.output import plotly_js

from .helpers import Synthetic, decoded, payload

MAX_BYTES = 8_000_000
MAX_DATA_BYTES = 3_000_000
"""The page without plotly.js: the data, the tables and the page's own script."""


@pytest.mark.slow
def test_a_100k_step_500_parameter_report_is_a_few_mb(big_run: Synthetic,
                                                      tmp_path: Path) -> None:
    out = tmp_path / "big.html"
    started = time.perf_counter()
    written = write_report(big_run.run_dir, out)
    seconds = time.perf_counter() - started
    size = out.stat().st_size
    data_bytes = size - len(plotly_js().encode())
    print(f"\n100k x 500 report: {size / 1e6:.2f} MB ({data_bytes / 1e6:.2f} MB without "
          f"plotly.js), built in {seconds:.1f} s")
    assert written.bytes == size and written.plots == 10
    assert size <= MAX_BYTES and data_bytes <= MAX_DATA_BYTES

    data = payload(out.read_text(encoding="utf-8"))
    loss = next(f for f in data["figures"] if f["id"] == "loss")
    events = sorted(s for t in loss["data"] if t.get("name", "").split(" ")[-2:-1] == ["events"]
                    for s in t["x"])
    assert events == sorted(e.step for e in big_run.events), "no event dropped"
    assert len(events) >= 300
    line = next(t for t in loss["data"] if t.get("name") == "loss")
    steps, values = decoded(line["x"]), decoded(line["y"])
    assert steps.size <= 4100
    assert values[np.flatnonzero(steps == big_run.spike_step)[0]] == big_run.spike_value
    hover = [h for t in loss["data"] for h in t.get("hovertext", [])]
    assert f"loss: NaN at step {big_run.nan_step}" in hover
    assert f"loss: inf at step {big_run.inf_step}" in hover
    grad = next(f for f in data["figures"] if f["id"] == "grad_heat")
    assert "500 x 100,000 recorded steps" in grad["layout"]["title"]["text"]
    assert "(NaN 1, inf 1)" in grad["layout"]["title"]["text"]
