"""The report's plots, as plotly figure specs (plain data, drawn by the page's script).

Line plots (loss, learning rate, global gradient norm) share one scheme: the downsampled line,
every event as a marker with a thin vertical line (hover: kind, severity, step, message), red
marks at the top for non-finite values (hover: "NaN at step N"), and shaded spans for the steps
whose update was skipped, rolled back or halted, and for the steps a rollback undid. They are
drawn on a hidden second y axis fixed to [0, 1], so they sit at the same height whatever the
data. Heat maps (a row per parameter or module, a column per bucket of steps) draw the largest
finite value of each cell and, on top, the cells that held a non-finite value in red.

Every string from the run is escaped (`escape.text`) before it enters a spec; titles count the
non-finite values they draw.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainguard.events import ActionRecord, Event
from trainguard.formatting import visible
from trainguard.registry import Kind
from trainguard.report import downsample, encode
from trainguard.report.data import Matrix, RunData, Scalar
from trainguard.report.escape import text
from trainguard.vocabulary import HIDDEN_LOSS

LINE_POINTS = 4000
"""Points per line at most (min and max of 2000 buckets)."""
HEAT_COLUMNS = 200
"""Columns per heat map at most."""
MAX_SPANS = 1000
"""Shaded spans per kind at most: closer ones are merged beyond that."""
MESSAGE_CHARS = 600
"""Hover text keeps this much of an event's message (the events table has it whole)."""

SEVERITY_COLOURS = {"info": "#7f7f7f", "warning": "#ff7f0e", "error": "#c0392b",
                    "critical": "#000000"}
MARK_SYMBOLS = {"NaN": "x", "inf": "triangle-up", "-inf": "triangle-down"}
NONFINITE_COLOUR = "#e41a1c"
SHADES = {"skipped": ("skipped update", "rgba(255, 127, 14, 0.22)"),
          "rolled_back": ("rolled back", "rgba(148, 103, 189, 0.30)"),
          "halted": ("halted", "rgba(214, 39, 40, 0.30)"),
          "undone": ("undone by a rollback", "rgba(148, 103, 189, 0.12)")}
EVENT_LINES = 100
"""A severity with more events than this marks them without vertical lines (errors always)."""
MIN_SPAN = 1 / 500
"""Shaded spans are drawn at least this share of the run wide, so one step of 100k shows."""
EVENT_Y, MARK_Y = 0.9, 0.98
"""Heights on the overlay axis: event markers, non-finite marks."""


@dataclass(slots=True)
class Figures:
    figures: list[dict[str, Any]] = field(default_factory=list)
    """Each {"id", "data", "layout"}."""
    arrays: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Heat map grids, by key (see `encode`)."""
    absent: list[tuple[str, str]] = field(default_factory=list)
    """(panel title, why it is not drawn): what the run did not record."""


# -- small pieces ---------------------------------------------------------------------------------
def plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def nonfinite_note(counts: dict[str, int], unit: str = "value") -> str:
    """' - 3 non-finite values (NaN 2, inf 1)' or '' when there are none."""
    total = sum(counts.values())
    if not total:
        return ""
    kinds = ", ".join(f"{kind} {count:,}" for kind, count in counts.items())
    return f" \u2014 {plural(total, 'non-finite ' + unit)} ({kinds})"


def _wrapped(message: str) -> str:
    shown = message if len(message) <= MESSAGE_CHARS else message[:MESSAGE_CHARS - 1] + "\u2026"
    lines = textwrap.wrap(visible(shown), 90, break_long_words=False,
                          break_on_hyphens=False) or [""]
    return "<br>".join(text(line) for line in lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _base_layout(title: str, y_title: str, *, height: int = 360) -> dict[str, Any]:
    return {
        "title": {"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 15}},
        "height": height, "margin": {"l": 70, "r": 30, "t": 80, "b": 40},
        "hovermode": "closest", "showlegend": True,
        "legend": {"orientation": "h", "x": 0, "y": -0.12, "yanchor": "top"},
        "xaxis": {"title": {"text": "step", "standoff": 4}, "zeroline": False},
        "yaxis": {"title": {"text": y_title}, "zeroline": False},
        "yaxis2": {"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True},
        "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff",
    }


def _scale_buttons() -> list[dict[str, Any]]:
    return [{"type": "buttons", "direction": "right", "x": 1, "xanchor": "right", "y": 1.02,
             "yanchor": "bottom", "showactive": True, "pad": {"r": 0, "t": 0},
             "buttons": [{"label": "linear", "method": "relayout",
                          "args": [{"yaxis.type": "linear"}]},
                         {"label": "log", "method": "relayout",
                          "args": [{"yaxis.type": "log"}]}]}]


def _line_trace(name: str, steps: np.ndarray, values: np.ndarray, colour: str, *,
                dash: str = "solid", width: float = 1.4) -> dict[str, Any]:
    return {"type": "scatter", "mode": "lines", "name": text(name),
            "x": encode.ints(steps), "y": encode.floats(values),
            "line": {"color": colour, "width": width, "dash": dash},
            "hovertemplate": f"{text(name)} %{{y:.5g}} at step %{{x}}<extra></extra>"}


def mark_traces(marks: list[downsample.Mark], series: str) -> list[dict[str, Any]]:
    """Non-finite values: red marks at the top of the plot, one trace per kind."""
    out = []
    for kind in downsample.NONFINITE_KINDS:
        picked = [m for m in marks if m.kind == kind]
        if not picked:
            continue
        total = sum(m.count for m in picked)
        out.append({
            "type": "scatter", "mode": "markers", "yaxis": "y2", "cliponaxis": False,
            "name": text(f"{series} {kind} ({total:,})"),
            "x": [m.first for m in picked], "y": [MARK_Y] * len(picked),
            "marker": {"symbol": MARK_SYMBOLS[kind], "color": NONFINITE_COLOUR, "size": 10,
                       "line": {"width": 2, "color": NONFINITE_COLOUR}},
            "hovertext": [text(f"{series}: {m.describe()}") for m in picked],
            "hoverinfo": "text"})
    return out


def event_traces(data: RunData) -> list[dict[str, Any]]:
    """Every event (never downsampled): a marker per event, one trace per severity, and thin
    vertical lines down through the data for errors and for severities with few events."""
    out = []
    by_severity: dict[str, list[Any]] = {}
    for event in data.events:
        by_severity.setdefault(event.severity, []).append(event)
    for severity in sorted(by_severity, key=lambda s: list(SEVERITY_COLOURS).index(s)
                           if s in SEVERITY_COLOURS else 99):
        events = by_severity[severity]
        colour = SEVERITY_COLOURS.get(severity, "#17becf")
        group = f"events-{text(severity)}"
        if len(events) <= EVENT_LINES or severity in ("error", "critical"):
            xs: list[int | None] = []
            ys: list[float | None] = []
            for event in events:
                xs.extend([event.step, event.step, None])
                ys.extend([0.0, EVENT_Y, None])
            out.append({"type": "scatter", "mode": "lines", "yaxis": "y2", "x": xs, "y": ys,
                        "line": {"color": colour, "width": 1}, "opacity": 0.35,
                        "hoverinfo": "skip", "showlegend": False, "legendgroup": group})
        hover = []
        for event in events:
            lines = [f"<b>{text(event.kind)}</b> ({text(event.severity)}) at step {event.step}",
                     _wrapped(event.message)]
            if event.param:
                lines.append(f"parameter: {text(event.param)}")
            if event.value is not None:
                lines.append(f"value: {text(_fmt(event.value))}")
            hover.append("<br>".join(lines))
        out.append({"type": "scatter", "mode": "markers", "yaxis": "y2", "cliponaxis": False,
                    "name": text(f"{severity} events ({len(events):,})"),
                    "legendgroup": group, "x": [e.step for e in events],
                    "y": [EVENT_Y] * len(events), "hovertext": hover, "hoverinfo": "text",
                    "marker": {"symbol": "diamond", "size": 9, "color": colour,
                               "line": {"width": 1, "color": "#ffffff"}}})
    return out


def hidden_loss_steps(data: RunData) -> list[int]:
    """Steps whose non-finite loss the trainer's logged loss hid (the HF Trainer's
    `logging_nan_inf_filter`), as their events say."""
    return sorted({e.step for e in data.events
                   if e.kind == Kind.NONFINITE_LOSS and e.details.get(HIDDEN_LOSS) is True})


def hidden_loss_trace(steps: list[int]) -> list[dict[str, Any]]:
    """A mark under each such step on the loss plot, named for what it is."""
    if not steps:
        return []
    count = plural(len(steps), "step")
    return [{"type": "scatter", "mode": "markers", "yaxis": "y2", "cliponaxis": False,
             "name": text(f"non-finite loss hidden from the trainer's log ({count})"),
             "x": steps, "y": [EVENT_Y * 0.93] * len(steps), "hoverinfo": "text",
             "hovertext": [f"step {s}: the loss was not finite; the trainer logged the average "
                           f"of its earlier losses instead (logging_nan_inf_filter)"
                           for s in steps],
             "marker": {"symbol": "x", "size": 8, "color": "#d62728"}}]


def spans(steps: np.ndarray, mask: np.ndarray, max_spans: int = MAX_SPANS) -> list[list[int]]:
    """[first, last] step of each run of consecutive rows where `mask` holds; beyond
    `max_spans`, the closest runs are merged so that every masked step stays covered."""
    if not mask.any():
        return []
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    firsts = steps[np.flatnonzero(edges == 1)]
    lasts = steps[np.flatnonzero(edges == -1) - 1]
    if firsts.size > max_spans:
        gaps = firsts[1:] - lasts[:-1]
        keep = np.sort(np.argsort(gaps, kind="stable")[firsts.size - max_spans:])
        firsts = np.concatenate([[firsts[0]], firsts[1:][keep]])
        lasts = np.concatenate([lasts[:-1][keep], [lasts[-1]]])
    return [[int(a), int(b)] for a, b in zip(firsts, lasts, strict=True)]


def rollback_spans(data: RunData) -> list[list[int]]:
    """[first, last] steps each rollback undid (its events and actions, `to_step` on)."""
    found: set[tuple[int, int]] = set()
    records: list[Event | ActionRecord] = [*data.events, *data.actions]
    for record in records:
        if record.kind != "rollback":
            continue
        target = record.details.get("to_step")
        if isinstance(target, int) and not isinstance(target, bool) and target <= record.step:
            found.add((target, record.step))
    return [list(pair) for pair in sorted(found)]


def shade_traces(data: RunData) -> list[dict[str, Any]]:
    """Filled spans on the overlay axis, one trace per kind (hover names the kind)."""
    out = []
    kinds: list[tuple[str, list[list[int]], int]] = []
    for action in ("skipped", "rolled_back", "halted"):
        mask = data.step_actions == action
        kinds.append((action, spans(data.steps, mask), int(mask.sum())))
    undone = rollback_spans(data)
    kinds.append(("undone", undone, len(undone)))
    extent = int(data.steps[-1] - data.steps[0]) if data.steps.size else 0
    minimum = extent * MIN_SPAN
    for kind, found, count in kinds:
        if not found:
            continue
        label, colour = SHADES[kind]
        xs: list[float | None] = []
        ys: list[float | None] = []
        for first, last in found:
            pad = max(0.5, (minimum - (last - first)) / 2)
            xs.extend([first - pad, first - pad, last + pad, last + pad, None])
            ys.extend([0.0, 1.0, 1.0, 0.0, None])
        what = plural(count, "rollback") if kind == "undone" else plural(count, "step")
        out.append({"type": "scatter", "mode": "lines", "yaxis": "y2", "x": xs, "y": ys,
                    "fill": "toself", "fillcolor": colour, "line": {"width": 0},
                    "hoveron": "fills", "hoverinfo": "name", "name": text(f"{label} ({what})")})
    return out


def _positive(line: downsample.Line) -> bool:
    finite = line.values[np.isfinite(line.values)]
    return bool(finite.size) and bool((finite > 0).all())


def _downsampled(line: downsample.Line, total: int) -> str:
    return "" if line.steps.size >= total else " (min and max per bucket)"


# -- line plots -----------------------------------------------------------------------------------
def loss_figure(data: RunData) -> dict[str, Any] | None:
    if not data.loss.recorded:
        return None
    drawn = downsample.line(data.steps, data.loss.values, LINE_POINTS, data.loss.missing)
    hidden = hidden_loss_steps(data)
    note = (f"; {plural(len(hidden), 'step')} hidden from the trainer's logged loss"
            if hidden else "")
    title = (f"Loss{nonfinite_note(drawn.counts, 'step')}{note}"
             f"{_downsampled(drawn, data.steps.size)}")
    layout = _base_layout(title, "loss")
    layout["updatemenus"] = _scale_buttons()
    traces = [*shade_traces(data),
              _line_trace("loss", drawn.steps, drawn.values, "#1f77b4"),
              *mark_traces(drawn.marks, "loss"), *event_traces(data), *hidden_loss_trace(hidden)]
    return {"id": "loss", "data": traces, "layout": layout}


def lr_figure(data: RunData) -> dict[str, Any] | None:
    if not any(lr.recorded for lr in data.lrs):
        return None
    colours = ["#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
    traces: list[dict[str, Any]] = []
    marks: list[downsample.Mark] = []
    counts: dict[str, int] = {}
    lines = []
    groups: list[tuple[list[int], Scalar]] = []  # groups with the very same schedule share a line
    for group, lr in enumerate(data.lrs):
        same = next((g for g in groups if np.array_equal(g[1].values, lr.values, equal_nan=True)
                     and np.array_equal(g[1].missing, lr.missing)), None)
        if same is None:
            groups.append(([group], lr))
        else:
            same[0].append(group)
    for number, (members, lr) in enumerate(groups):
        drawn = downsample.line(data.steps, lr.values, LINE_POINTS, lr.missing)
        name = ("lr" if len(data.lrs) == 1 else
                f"lr group {members[0]}" if len(members) == 1 else
                f"lr groups {', '.join(str(m) for m in members)}")
        lines.append(_line_trace(name, drawn.steps, drawn.values,
                                 colours[number % len(colours)]))
        marks.extend(drawn.marks)
        for kind, count in drawn.counts.items():
            counts[kind] = counts.get(kind, 0) + count
    traces = [*shade_traces(data), *lines, *mark_traces(marks, "lr"), *event_traces(data)]
    title = f"Learning rate{nonfinite_note(counts, 'value')}"
    return {"id": "lr", "data": traces, "layout": _base_layout(title, "learning rate")}


def clip_levels(data: RunData) -> list[tuple[int, float]]:
    """(from step, clip level) for the global clip: the configured `clip.max_grad_norm`, then each
    rollback's new level (its details' `clip.max_grad_norm`)."""
    levels: list[tuple[int, float]] = []
    if data.max_grad_norm is not None and data.steps.size:
        levels.append((int(data.steps[0]), data.max_grad_norm))
    for event in data.events:
        level = event.details.get("max_grad_norm") if event.kind == "rollback" else None
        if isinstance(level, (int, float)) and not isinstance(level, bool) \
                and math.isfinite(level) and level > 0:
            levels.append((event.step, float(level)))
    return levels


def grad_norm_figure(data: RunData) -> dict[str, Any] | None:
    if not data.grad_norm.recorded:
        return None
    norm = data.grad_norm
    drawn = downsample.line(data.steps, norm.values, LINE_POINTS, norm.missing)
    coef = np.where(data.clip_coef.missing, 1.0, data.clip_coef.values)
    clipped = (coef < 1.0) & ~norm.missing
    traces: list[dict[str, Any]] = [*shade_traces(data),
                                    _line_trace("gradient norm", drawn.steps, drawn.values,
                                                "#1f77b4")]
    if clipped.any():  # what the optimizer used: nothing on steps whose update was dropped
        unused = norm.missing | ~np.isin(data.step_actions, ("applied", "clipped"))
        after = downsample.line(data.steps, norm.values * coef, LINE_POINTS, unused)
        traces.append(_line_trace("after clipping", after.steps, after.values, "#17becf",
                                  dash="dot"))
    levels = clip_levels(data)
    if levels:
        last = int(data.steps[-1])
        xs = [step for step, _ in levels] + [max(last, levels[-1][0])]
        ys = [level for _, level in levels] + [levels[-1][1]]
        traces.append({"type": "scatter", "mode": "lines", "name": "clip level",
                       "x": xs, "y": ys, "line": {"color": "#d62728", "dash": "dash",
                                                  "width": 1.5, "shape": "hv"},
                       "hovertemplate": "clip level %{y:.4g} from step %{x}<extra></extra>"})
    traces.extend(mark_traces(drawn.marks, "gradient norm"))
    traces.extend(event_traces(data))
    level = (f"; clip level {levels[0][1]:g}" if len(levels) == 1 else
             f"; clip level {levels[0][1]:g}, changed {len(levels) - 1}x" if levels else "")
    title = (f"Global gradient norm (clipped on {plural(int(clipped.sum()), 'step')}{level})"
             f"{nonfinite_note(drawn.counts, 'step')}")
    layout = _base_layout(title, "gradient norm")
    layout["updatemenus"] = _scale_buttons()
    if _positive(drawn):
        layout["yaxis"]["type"] = "log"
    return {"id": "grad_norm", "data": traces, "layout": layout}


# -- heat maps --------------------------------------------------------------------------------
def _decade_ticks(lo: float, hi: float) -> dict[str, Any]:
    first, last = math.ceil(lo), math.floor(hi)
    if last - first < 1:
        return {}
    step = max(1, math.ceil((last - first + 1) / 8))
    values = list(range(first, last + 1, step))
    return {"tickvals": values, "ticktext": [f"1e{v}" for v in values]}


def column_marks(cells: downsample.Grid, names: list[str]) -> list[dict[str, Any]]:
    """Red marks above every column of a heat map that holds a non-finite cell (a cell may be
    a pixel high; the mark is not), naming the rows."""
    hit = cells.flags != 0
    columns = np.flatnonzero(hit.any(axis=0))
    if not columns.size:
        return []
    hover = []
    for column in columns:
        rows = np.flatnonzero(hit[:, column])
        kinds = [kind for bit, kind in zip((downsample.FLAG_NAN, downsample.FLAG_INF,
                                            downsample.FLAG_NINF), downsample.NONFINITE_KINDS,
                                           strict=True)
                 if (cells.flags[rows, column] & bit).any()]
        first, last = int(cells.starts[column]), int(cells.ends[column])
        where = f"step {first}" if first == last else f"steps {first}..{last}"
        shown = ", ".join(names[r] for r in rows[:5]) + (
            f" and {rows.size - 5} more" if rows.size > 5 else "")
        hover.append(text(f"{' and '.join(kinds)} in {where}: {plural(int(rows.size), 'row')}"
                          f" ({shown})"))
    return [{"type": "scatter", "mode": "markers", "yaxis": "y2", "cliponaxis": False,
             "name": "non-finite", "x": [int(cells.starts[c]) for c in columns],
             "y": [1.0] * int(columns.size), "hovertext": hover, "hoverinfo": "text",
             "marker": {"symbol": "triangle-down", "size": 10, "color": NONFINITE_COLOUR}}]


def heat_figure(key: str, title: str, matrix: Matrix, *, log: bool, what: str,
                fixed: tuple[float, float] | None = None) -> tuple[dict[str, Any], dict] | None:
    """A heat map figure and its grid (`Figures.arrays[key]`), None when nothing was measured."""
    if matrix.empty:
        return None
    cells = downsample.grid(matrix.steps, matrix.values, HEAT_COLUMNS, matrix.missing)
    names = [text(name) for name in matrix.names]
    colour = fixed or encode.colour_range(cells, log) or (0.0, 1.0)
    colorbar: dict[str, Any] = {"title": {"text": text(what if not log else f"{what} (log)"),
                                          "side": "right"}, "thickness": 14}
    if log:
        colorbar.update(_decade_ticks(*colour))
    hover = "%{y}<br>%{text}<extra></extra>"
    traces: list[dict[str, Any]] = [{
        "type": "heatmap", "y": names, "tggrid": {"array": key, "part": "values"},
        "colorscale": "Viridis", "zmin": colour[0], "zmax": colour[1], "colorbar": colorbar,
        "hovertemplate": hover, "hoverongaps": False, "name": text(what)}]
    if cells.nonfinite:
        traces.append({"type": "heatmap", "y": names, "tggrid": {"array": key, "part": "flags"},
                       "colorscale": [[0, NONFINITE_COLOUR], [1, NONFINITE_COLOUR]],
                       "zmin": 0, "zmax": 1, "showscale": False, "hovertemplate": hover,
                       "hoverongaps": False, "name": "non-finite"})
    traces.extend(column_marks(cells, matrix.names))
    per = ""
    if cells.starts.size < matrix.steps.size:
        per = f", max per bucket of ~{math.ceil(matrix.steps.size / cells.starts.size)} steps"
    full = (f"{title} ({len(names):,} x {matrix.steps.size:,} recorded steps{per})"
            f"{nonfinite_note(cells.counts)}")
    rows = len(names)
    layout = _base_layout(full, "", height=int(min(900, max(320, 110 + 9 * rows))))
    layout["showlegend"] = False
    layout["margin"]["l"] = 10
    layout["yaxis"] = {"type": "category", "autorange": "reversed", "automargin": True,
                       "tickfont": {"size": 10}}
    return {"id": key, "data": traces, "layout": layout}, encode.grid(cells, log)


HEAT_MAPS: tuple[tuple[str, str, str, str, bool, tuple[float, float] | None], ...] = (
    # key, source, metric, title, log, fixed colour range
    ("grad_heat", "grads", "grad_norm", "Per-parameter gradient norm", True, None),
    ("update_heat", "params", "update_ratio", "Update ratio |\u0394w| / |w| (sampled steps)",
     True, None),
    ("weight_maxabs_heat", "params", "weight_maxabs", "Weight health: max |w| (sampled steps)",
     True, None),
    ("weight_std_heat", "params", "weight_std", "Weight health: std of w (sampled steps)", True,
     None),
    ("act_zero_heat", "modules", "act_zero_frac",
     "Activations: share of exact zeros (sampled steps)", False, (0.0, 1.0)),
    ("act_maxabs_heat", "modules", "act_maxabs", "Activations: max |output| (sampled steps)",
     True, None),
    ("act_dead_heat", "modules", "act_dead_frac",
     "Activations: share of dead units (sampled steps)", False, (0.0, 1.0)),
)


def build_figures(data: RunData) -> Figures:
    out = Figures()
    for title, make in (("Loss", loss_figure), ("Learning rate", lr_figure),
                        ("Global gradient norm", grad_norm_figure)):
        figure = make(data)
        if figure is None:
            out.absent.append((title, "not recorded in this run"))
        else:
            out.figures.append(figure)
    for key, source, metric, title, log, fixed in HEAT_MAPS:
        if source == "grads":
            matrix: Matrix | None = data.grads
        elif source == "params":
            matrix = data.params.get(metric)
        else:
            matrix = data.modules.get(metric)
        made = None if matrix is None else heat_figure(key, title, matrix, log=log, what=metric,
                                                       fixed=fixed)
        if made is None:
            out.absent.append((title, f"no {metric} recorded in this run"))
            continue
        figure, cells = made
        out.figures.append(figure)
        out.arrays[key] = cells
    return out
