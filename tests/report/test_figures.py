"""What the report draws: every event, the non-finite values as marks, the shaded steps, the
clip level, and the heat maps with their non-finite cells."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

import trainguard
from trainguard.report import build_report, encode
from trainguard.report.data import read_run
from trainguard.report.figures import build_figures, spans
from trainguard.store import RunStore

from .helpers import Synthetic, decoded, grid_codes, payload

LINE_IDS = ["loss", "lr", "grad_norm"]
HEAT_IDS = ["grad_heat", "update_heat", "weight_maxabs_heat", "weight_std_heat", "act_zero_heat",
            "act_maxabs_heat", "act_dead_heat"]


def _figure(data: dict, key: str) -> dict:
    return next(f for f in data["figures"] if f["id"] == key)


def _hover(figure: dict) -> list[str]:
    return [h for trace in figure["data"] for h in trace.get("hovertext", [])]


def test_every_panel_is_drawn_for_a_full_run(small_run: Synthetic) -> None:
    html, figures = build_report(small_run.run_dir)
    data = payload(html)
    assert [f["id"] for f in data["figures"]] == LINE_IDS + HEAT_IDS
    assert figures.absent == []
    assert set(data["arrays"]) == set(HEAT_IDS)
    for key in LINE_IDS + HEAT_IDS:
        assert f'<div class="plot" id="plot-{key}"></div>' in html


def test_every_event_is_marked_with_kind_severity_and_message(small_run: Synthetic) -> None:
    data = payload(build_report(small_run.run_dir)[0])
    for key in LINE_IDS:
        figure = _figure(data, key)
        markers = [t for t in figure["data"] if t.get("name", "").endswith(" events "
                                                                    f"({len(t['x']):,})")]
        steps = sorted(s for t in markers for s in t["x"])
        assert steps == sorted(e.step for e in small_run.events), key
        hover = _hover(figure)
        assert any("<b>loss_spike</b> (warning) at step " f"{small_run.spike_step}" in h
                   and "loss jumped to 50" in h for h in hover)
        assert any("<b>nonfinite_loss</b> (error)" in h for h in hover)


def test_non_finite_values_are_marked_and_counted(small_run: Synthetic) -> None:
    data = payload(build_report(small_run.run_dir)[0])
    loss = _figure(data, "loss")
    assert "2 non-finite steps (NaN 1, inf 1)" in loss["layout"]["title"]["text"]
    hover = _hover(loss)
    assert f"loss: NaN at step {small_run.nan_step}" in hover
    assert f"loss: inf at step {small_run.inf_step}" in hover
    line = next(t for t in loss["data"] if t["name"] == "loss")
    steps, values = decoded(line["x"]), decoded(line["y"])
    assert math.isnan(values[list(steps).index(small_run.nan_step)]), "a gap, not a value"
    assert values[list(steps).index(small_run.spike_step)] == small_run.spike_value
    grad = _figure(data, "grad_norm")
    assert "NaN 1, inf 1" in grad["layout"]["title"]["text"]
    assert f"gradient norm: NaN at step {small_run.nan_step}" in _hover(grad)


def test_skipped_and_rolled_back_steps_are_shaded(small_run: Synthetic) -> None:
    data = payload(build_report(small_run.run_dir)[0])
    traces = {t["name"]: t for t in _figure(data, "loss")["data"] if t.get("fill") == "toself"}
    assert set(traces) == {"skipped update (2 steps)", "rolled back (1 step)",
                           "undone by a rollback (1 rollback)"}

    def covered(trace: dict, step: int) -> bool:
        xs = trace["x"]
        boxes = [xs[i:i + 4] for i in range(0, len(xs), 5)]
        return any(box[0] <= step <= box[2] for box in boxes)

    assert covered(traces["skipped update (2 steps)"], small_run.nan_step)
    assert covered(traces["skipped update (2 steps)"], small_run.inf_step)
    assert covered(traces["rolled back (1 step)"], small_run.rollback_step)
    undone = traces["undone by a rollback (1 rollback)"]
    assert covered(undone, small_run.rollback_to) and covered(undone, small_run.rollback_step)


def test_the_gradient_norm_shows_the_clip_level_and_its_changes(small_run: Synthetic) -> None:
    data = payload(build_report(small_run.run_dir)[0])
    grad = _figure(data, "grad_norm")
    level = next(t for t in grad["data"] if t["name"] == "clip level")
    assert level["y"][:2] == [1.0, 0.5], "configured, then lowered by the rollback"
    assert level["x"][1] == small_run.rollback_step
    assert any(t["name"] == "after clipping" for t in grad["data"])
    assert "clip level 1, changed 1x" in grad["layout"]["title"]["text"]


def test_heat_maps_hold_every_cell_and_flag_non_finite_ones(small_run: Synthetic) -> None:
    data = payload(build_report(small_run.run_dir)[0])
    spec = data["arrays"]["grad_heat"]
    codes = grid_codes(spec)
    assert codes.shape == (len(small_run.names), small_run.steps)
    assert codes[1, small_run.nan_step] == encode.NAN
    assert codes[2, small_run.inf_step] == encode.INF
    finite = codes[codes >= -encode.LEVELS]
    assert finite.size == codes.size - 2
    units = spec["lo"] + (int(codes[0, small_run.spike_step]) + encode.LEVELS) * spec["scale"]
    assert abs(10 ** units - 1e4) / 1e4 < 1e-3, "the spike's value, to 3 digits or better"
    figure = _figure(data, "grad_heat")
    assert "2 non-finite values (NaN 1, inf 1)" in figure["layout"]["title"]["text"]
    assert [t["tggrid"]["part"] for t in figure["data"] if "tggrid" in t] == ["values", "flags"]
    marks = next(t for t in figure["data"] if t.get("name") == "non-finite"
                 and t["type"] == "scatter")
    assert marks["x"] == [small_run.nan_step, small_run.inf_step]
    assert f"NaN in step {small_run.nan_step}: 1 row (layers.0.bias)" in marks["hovertext"][0]
    ratio = _figure(data, "update_heat")
    assert "(NaN 2)" in ratio["layout"]["title"]["text"]
    zero = data["arrays"]["act_zero_heat"]
    assert not zero["log"] and grid_codes(zero).shape == (4, small_run.steps // 10)


def test_a_run_without_sampled_statistics_still_reports(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.put_meta("param_names", ["w"])
    for step in range(5):
        store.put_step(step, {"loss": 1.0 / (step + 1), "grad_norm": 0.5, "lr": None,
                              "action": "applied"}, np.array([0.5]))
    store.close()
    html, figures = build_report(tmp_path)
    assert [f["id"] for f in figures.figures] == ["loss", "grad_norm", "grad_heat"]
    assert ("Learning rate", "not recorded in this run") in figures.absent
    assert "no update_ratio recorded in this run" in html
    assert "no verdict recorded" in html and "trainguard took no action" in html


def test_parameters_watched_late_are_missing_not_nan(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.put_meta("trainguard_version", trainguard.__version__)
    store.put_meta("param_names", ["a", "b", "late"])
    store.put_meta("param_widths", [[0, 2], [5, 3]])
    for step in range(10):
        width = 2 if step < 5 else 3
        store.put_step(step, {"loss": 1.0, "grad_norm": 1.0, "action": "applied"},
                       np.full(width, 0.1))
        store.put_param_metrics(step, {"update_ratio": np.full(width, 1e-3)})
    store.close()
    data = read_run(tmp_path)
    assert data.grads.missing[:5, 2].all() and not data.grads.missing[5:, 2].any()
    figures = build_figures(data)
    for key in ("grad_heat", "update_heat"):
        codes = grid_codes(figures.arrays[key])
        assert (codes[2, :5] == encode.MISSING).all() and (codes[2, 5:] > encode.ZERO).all()
        figure = next(f for f in figures.figures if f["id"] == key)
        assert "non-finite" not in figure["layout"]["title"]["text"]


def test_spans_merge_beyond_the_limit_and_cover_every_step() -> None:
    steps = np.arange(10_000)
    mask = np.zeros(steps.size, dtype=bool)
    mask[::3] = True
    mask[5000:5100] = True
    found = spans(steps, mask, max_spans=50)
    assert len(found) <= 50
    covered = np.zeros(steps.size, dtype=bool)
    for first, last in found:
        covered[first:last + 1] = True
    assert covered[mask].all()
    assert spans(steps, np.zeros(steps.size, dtype=bool)) == []
    assert spans(np.array([3, 4, 9]), np.array([True, True, True])) == [[3, 9]]


def test_the_tables_carry_verdict_diagnosis_preflight_and_actions(small_run: Synthetic) -> None:
    html, _ = build_report(small_run.run_dir)
    assert "<b>RECOVERED</b>: back on track" in html
    assert "<b>lr_too_high</b>" in html and "lower the LR" in html
    assert f"loss spiked at step {small_run.spike_step}" in html
    assert "no warmup" in html and "add warmup" in html
    assert "actions: rollback <b>1</b>, skip <b>2</b>" in html
    assert "skipped <b>2</b>" in html and "rolled_back <b>1</b>" in html
    assert f"Events ({len(small_run.events)})" in html


def test_a_run_with_no_steps_reports_what_it_has(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.put_meta("param_names", ["w"])
    store.put_meta("preflight", [{"check": "warmup", "severity": "error", "message": "none",
                                  "fix": "add it", "cause": None, "evidence": {}}])
    store.close()
    html, figures = build_report(tmp_path)
    assert figures.figures == [] and len(figures.absent) == 10
    assert "0 recorded" in html and "add it" in html
    assert 'data-expected="0"' in html


def test_lr_groups_with_one_schedule_share_a_line_and_big_steps_stay_exact(
        tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.put_meta("param_names", ["w"])
    first = 3_000_000_000  # beyond int32
    for i in range(4):
        store.put_step(first + i, {"loss": 1.0, "grad_norm": 0.5, "lr": 1e-3,
                                   "lrs": [1e-3, 1e-3 * (i + 1), 1e-3], "action": "applied"},
                       np.array([0.5]))
    store.close()
    data = payload(build_report(tmp_path)[0])
    lr = _figure(data, "lr")
    names = [t["name"] for t in lr["data"] if t["type"] == "scatter" and "lr" in t["name"]]
    assert names == ["lr groups 0, 2", "lr group 1"]
    steps = decoded(lr["data"][0]["x"])
    assert list(steps) == [first + i for i in range(4)]
    assert lr["data"][0]["x"]["tg"] == "f8"
