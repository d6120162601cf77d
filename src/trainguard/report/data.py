"""Everything the report shows, read once from a run store into plain arrays and records.

Each per-step scalar keeps its NaN and inf values and says separately which steps did not record
it at all (`missing`), so the report can draw the first and leave a gap for the second. A
per-parameter matrix marks the parameters that were not yet watched at a step (the optimizer
gained them later, meta `param_widths`) as missing too, never as NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.events import ActionRecord, Event
from trainguard.store.reader import RunReader

PARAM_METRICS = ("update_ratio", "weight_maxabs", "weight_std")
MODULE_METRICS = ("act_zero_frac", "act_maxabs", "act_dead_frac")
SHADED_ACTIONS = ("skipped", "rolled_back", "halted")


@dataclass(frozen=True, slots=True)
class Scalar:
    """One per-step value: `values[i]` at `steps[i]`; `missing[i]` when the step had none."""

    values: np.ndarray
    missing: np.ndarray

    @property
    def recorded(self) -> bool:
        return bool((~self.missing).any())


@dataclass(frozen=True, slots=True)
class Matrix:
    """A per-parameter or per-module metric: `values[step, row]`, rows named by `names`."""

    steps: np.ndarray
    names: list[str]
    values: np.ndarray
    missing: np.ndarray

    @property
    def empty(self) -> bool:
        return self.values.size == 0 or bool(self.missing.all())


@dataclass(slots=True)
class RunData:
    run_dir: str
    run_id: int
    run_ids: list[int]
    info: dict[str, Any]
    """The run's `runs()` entry: status, started, ended, resumed, store failure..."""
    meta: dict[str, Any]
    steps: np.ndarray
    loss: Scalar
    grad_norm: Scalar
    clip_coef: Scalar
    lrs: list[Scalar]
    """One LR per parameter group (the first group's is the step's `lr`)."""
    step_actions: np.ndarray
    """What happened to each step's update: applied, clipped, skipped, rolled_back, halted."""
    events: list[Event]
    actions: list[ActionRecord]
    grads: Matrix
    params: dict[str, Matrix] = field(default_factory=dict)
    modules: dict[str, Matrix] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def config(self) -> dict[str, Any]:
        config = self.meta.get("config", {})
        return config if isinstance(config, dict) else {}

    @property
    def max_grad_norm(self) -> float | None:
        """The clip level the run started with (None when it did not clip)."""
        clip = self.config.get("clip")
        # a store of an older version kept the configuration flat
        value = clip.get("max_grad_norm") if isinstance(clip, dict) else self.config.get(
            "max_grad_norm")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
        return None


def _scalar(rows: list[dict[str, Any]], name: str) -> Scalar:
    raw = [row.get(name) for row in rows]
    missing = np.array([value is None for value in raw], dtype=bool)
    values = np.array([np.nan if value is None else float(value) for value in raw],
                      dtype=np.float64)
    return Scalar(values, missing)


def _group_lrs(rows: list[dict[str, Any]]) -> list[Scalar]:
    groups = max((len(row["lrs"]) for row in rows if isinstance(row.get("lrs"), list)),
                 default=1)
    if groups <= 1:
        return [_scalar(rows, "lr")]
    out = []
    for group in range(groups):
        raw = []
        for row in rows:
            lrs = row.get("lrs")
            if isinstance(lrs, list):
                raw.append(lrs[group] if group < len(lrs) else None)
            else:
                raw.append(row.get("lr") if group == 0 else None)
        missing = np.array([value is None for value in raw], dtype=bool)
        out.append(Scalar(np.array([np.nan if v is None else float(v) for v in raw]), missing))
    return out


def _watched(steps: np.ndarray, width: int, widths: Any) -> np.ndarray:
    """[step, param] True where the parameter was watched at that step."""
    watched = np.ones((steps.size, width), dtype=bool)
    if not isinstance(widths, list) or not widths:
        return watched
    counts = np.full(steps.size, width, dtype=np.int64)
    for first, count in widths:  # in order; a later entry wins from its first step on
        counts[steps >= first] = count
    return np.arange(width)[None, :] < counts[:, None]


def _param_matrix(steps: np.ndarray, matrix: np.ndarray, names: list[str],
                  widths: Any) -> Matrix:
    width = matrix.shape[1] if matrix.ndim == 2 else 0
    labels = list(names[:width]) + [f"#{i}" for i in range(len(names), width)]
    missing = ~_watched(steps, width, widths)
    return Matrix(steps, labels, matrix, missing)


def _module_matrix(records: list[tuple[int, list[str], np.ndarray]]) -> Matrix:
    names: dict[str, int] = {}
    for _, row_names, _ in records:
        for name in row_names:
            names.setdefault(name, len(names))
    steps = np.array([step for step, _, _ in records], dtype=np.int64)
    values = np.full((len(records), len(names)), np.nan)
    missing = np.ones(values.shape, dtype=bool)
    for i, (_, row_names, row) in enumerate(records):
        where = [names[name] for name in row_names]
        values[i, where] = row
        missing[i, where] = False
    return Matrix(steps, list(names), values, missing)


def read_run(run_dir: str | Path, run: int | None = None) -> RunData:
    """Read one run (the latest unless `run` names another). Raises `StoreError` for a missing,
    corrupt or damaged store."""
    with RunReader(run_dir, run=run) as reader:
        meta = reader.meta()
        info = reader.run_info()
        rows = reader.steps()
        steps = np.array([row["step"] for row in rows], dtype=np.int64)
        names = reader.param_names()
        widths = meta.get("param_widths")
        grad_steps, grad_matrix = reader.param_grad_norms()
        grads = _param_matrix(grad_steps, grad_matrix, names, widths)
        params = {}
        available = set(reader.param_metric_names())
        for metric in PARAM_METRICS:
            if metric in available:
                metric_steps, matrix = reader.param_metric(metric)
                params[metric] = _param_matrix(metric_steps, matrix, names, widths)
        modules = {}
        for metric in MODULE_METRICS:
            records = reader.module_metric(metric)
            if records:
                modules[metric] = _module_matrix(records)
        notes = []
        if reader.wal_unread:
            notes.append("read from read-only media without its write-ahead log: the last "
                         "records of a run that never closed may be missing")
        return RunData(
            run_dir=str(reader.run_dir), run_id=reader.run_id, run_ids=list(reader.run_ids),
            info=info, meta=meta, steps=steps, loss=_scalar(rows, "loss"),
            grad_norm=_scalar(rows, "grad_norm"), clip_coef=_scalar(rows, "clip_coef"),
            lrs=_group_lrs(rows),
            step_actions=np.array([str(row.get("action", "")) for row in rows], dtype=object),
            events=reader.events(), actions=reader.actions(), grads=grads, params=params,
            modules=modules, notes=notes)
