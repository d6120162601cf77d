"""trainguard's own run store (a run directory, or its `trainguard.db`), through `RunReader`.

A store holds every optimizer step, so its rows are steps (the logging interval is 1), with the
per-parameter gradient norms, the GradScaler's overflow flag, the parameter groups' learning
rates, the evaluations handed to the Guard and the detector thresholds the run used: replayed
through the detectors with those thresholds, the step-signal detectors raise what they raised
live (the probes' sampled statistics and the batches are not stored, so the detectors that read
them have nothing to say offline).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trainguard.analyze.log import GRAD_NORM, LOSS, LOSS_SCALE, LR, Log, LogError, Series
from trainguard.errors import StoreError

FORMAT = "store"


DB_NAME = "trainguard.db"
"""`trainguard.store.writer.DB_NAME`, spelled out so that telling a store from other logs does
not import the store package (and its sinks)."""


def is_store(path: Path) -> bool:
    return (path.is_dir() and (path / DB_NAME).is_file()) or path.name == DB_NAME


def read(path: str | Path, run: int | None = None) -> Log:
    from trainguard.store.reader import RunReader

    path = Path(path)
    run_dir = path.parent if path.name == DB_NAME and path.is_file() else path
    try:
        with RunReader(run_dir, run=run) as reader:
            rows = reader.steps()
            meta = reader.meta()
            _, grads = reader.param_grad_norms() if rows else (None, np.zeros((0, 0)))
            names = reader.param_names()
            events = reader.events()
    except StoreError as exc:
        raise LogError(str(exc)) from None
    if not rows:
        raise LogError(f"{run_dir}: the run store holds no steps yet")
    steps = [int(r["step"]) for r in rows]
    series = Series(len(rows), {
        LOSS: [_num(r.get("loss")) for r in rows],
        GRAD_NORM: [_num(r.get("grad_norm")) for r in rows],
        LR: [_num(r.get("lr")) for r in rows],
        LOSS_SCALE: [_num(r.get("loss_scale")) for r in rows],
    })
    lrs = [r.get("lrs") for r in rows]
    if any(lrs):
        width = max(len(v) for v in lrs if v)
        for group in range(1, width):
            series[f"lr_group{group}"] = [_num(v[group]) if v and group < len(v) else None
                                          for v in lrs]
    skipped = [bool(r.get("amp_overflow")) for r in rows]
    matrix = grads if grads is not None and grads.shape[0] == len(rows) else None
    config = meta.get("config", {}).get("detectors")
    evals = [(int(e["step"]), {f"eval_{k}" if not k.startswith("eval") else k: float(v)
                               for k, v in e["metrics"].items()})
             for e in meta.get("eval", [])]
    return Log(path=str(run_dir), format=FORMAT, steps=steps, series=series,
               skipped=skipped if any(skipped) else None, evals=evals,
               param_names=list(names) if matrix is not None else [],
               param_grad_norms=matrix, detector_config=config if isinstance(config, dict)
               else None, loss_curvature=[r.get("loss_curvature") for r in rows],
               own_verdict=_own_verdict(meta.get("verdict")), own_events=events)


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


def _own_verdict(value: Any) -> dict[str, Any] | None:
    """The run's verdict as the reader checked it (its word and message), with the levels and
    the first trouble step kept only where they are what the live verdict writes: a store is
    read as untrusted input."""
    if not isinstance(value, dict):
        return None
    own: dict[str, Any] = {"verdict": value["verdict"], "message": value["message"]}
    for key in ("start", "before_trouble", "final"):
        number = value.get(key)
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            own[key] = float(number)
    step = value.get("trouble_step")
    if isinstance(step, int) and not isinstance(step, bool):
        own["trouble_step"] = step
    return own
