"""The report's samples section: one strip per step the run kept, the broken ones marked, and
entries a damaged or hostile store holds left out, never rendered."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import torch

from trainguard.events import RunInfo
from trainguard.probes.sample_sheet import SampleSheet, draw
from trainguard.report.data import read_run
from trainguard.report.sample_grid import sample_entries, samples_html
from trainguard.store.sink import RunStoreSink, kept_sheets

from .helpers import HOSTILE

STATS = {"nonfinite": 0.0, "roughness": 0.02, "spread": 0.5, "saturated": 0.01,
         "diversity": 0.3}


def sheet(step: int, *, degraded: bool = False, first: bool = False) -> SampleSheet:
    images = torch.linspace(-1, 1, 2 * 3 * 8 * 8).reshape(2, 3, 8, 8)
    return SampleSheet(step=step, pixels=draw(images, -1.0, 1.0), stats=dict(STATS),
                       degraded=degraded, first=first)


def write(run_dir: Path, sheets: list[SampleSheet]) -> None:
    sink = RunStoreSink(run_dir)
    sink.on_run_start(RunInfo(run_dir=str(run_dir), param_names=["w"], param_shapes=[[2]],
                              config={}, trainguard_version="test"))
    for one in sheets:
        sink.on_samples(one)
    sink.on_run_end("finished")
    sink.close()


def test_the_kept_samples_are_drawn_with_the_broken_ones_marked(tmp_path: Path) -> None:
    write(tmp_path, [sheet(-1, first=True), sheet(49), sheet(99, degraded=True)])
    data = read_run(tmp_path)
    assert [e["step"] for e in sample_entries(data)] == [-1, 49, 99]
    html = samples_html(data)
    assert html is not None
    assert html.count('<img class="samples"') == 3
    assert html.count(">broken<") == 1 and "reference" in html
    png = base64.b64decode(sample_entries(data)[0]["png"])
    assert png.startswith(b"\x89PNG")


def test_a_run_without_samples_has_no_section(tmp_path: Path) -> None:
    write(tmp_path, [])
    assert samples_html(read_run(tmp_path)) is None


def test_entries_that_are_not_pngs_are_left_out(tmp_path: Path) -> None:
    write(tmp_path, [sheet(0, first=True)])
    data = read_run(tmp_path)
    good = data.meta["samples"][0]
    data.meta["samples"] = [
        good, {"step": 1, "png": HOSTILE}, {"step": 2, "png": base64.b64encode(b"GIF89a").decode()},
        {"step": HOSTILE, "png": good["png"], "stats": {"roughness": HOSTILE}}, "not a dict"]
    html = samples_html(data)
    assert html is not None and html.count("<img") == 2
    assert "<script>" not in html and "onerror=\"" not in html


def test_the_store_keeps_the_first_the_last_and_the_broken_ones() -> None:
    sheets = [{"step": i, "degraded": i in (30, 31)} for i in range(40)]
    kept = kept_sheets(sheets, cap=8)
    steps = [s["step"] for s in kept]
    assert len(kept) == 8 and steps[0] == 0 and steps[-1] == 39
    assert {30, 31} <= set(steps) and steps == sorted(steps)
    all_broken = [{"step": i, "degraded": True} for i in range(20)]
    assert len(kept_sheets(all_broken, cap=5)) == 5
    assert np.diff([s["step"] for s in kept_sheets(list(sheets), cap=16)]).min() >= 1
