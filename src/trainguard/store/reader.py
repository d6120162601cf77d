"""Reads a run store. Used by `trainguard show` and by later analysis and reports.

Every method returns plain Python / NumPy values. Non-finite values come back as NaN or inf,
never dropped, and `summary()` counts them explicitly.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.errors import StoreError
from trainguard.events import Event
from trainguard.store.writer import DB_NAME


def _blob(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<f4").astype(np.float64)


class RunReader:
    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        if not self.run_dir.exists():
            raise StoreError(f"no run directory at {self.run_dir}")
        if not self.run_dir.is_dir():
            raise StoreError(f"{self.run_dir} is not a directory")
        self.path = self.run_dir / DB_NAME
        if not self.path.is_file():
            raise StoreError(f"{self.run_dir} is not a trainguard run (no {DB_NAME} in it)")
        try:
            self._conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
            tables = {row[0] for row in self._conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path} is corrupt or not a trainguard store ({exc})") from None
        missing = {"meta", "steps", "events", "param_metrics", "module_metrics"} - tables
        if missing:
            raise StoreError(f"{self.path} is not a trainguard store (missing tables: "
                             f"{', '.join(sorted(missing))})")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> RunReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path} is corrupt ({exc})") from None

    def _json(self, text: str, what: str) -> Any:
        try:
            return json.loads(text)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"{self.path}: malformed {what} ({exc})") from None

    # -- run-level --------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        return {key: self._json(value, f"meta {key}")
                for key, value in self._query("SELECT key, value FROM meta")}

    def config(self) -> dict[str, Any]:
        return self.meta().get("config", {})

    def param_names(self) -> list[str]:
        return list(self.meta().get("param_names", []))

    # -- per step ---------------------------------------------------------------------------
    def steps(self) -> list[dict[str, Any]]:
        """One dict per recorded step: step, time, loss, grad_norm, lr, action, ..."""
        rows = self._query("SELECT step, time, data FROM steps ORDER BY step")
        return [{"step": step, "time": at, **self._json(data, f"step {step}")}
                for step, at, data in rows]

    def scalar(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of one per-step scalar; missing values are NaN."""
        rows = self.steps()
        steps = np.array([r["step"] for r in rows], dtype=np.int64)
        values = np.array([np.nan if r.get(name) is None else float(r[name]) for r in rows],
                          dtype=np.float64)
        return steps, values

    def param_grad_norms(self) -> tuple[np.ndarray, np.ndarray]:
        """(steps, matrix[step, param]) of per-parameter gradient norms."""
        rows = self._query("SELECT step, grad_norms FROM steps WHERE grad_norms IS NOT NULL "
                           "ORDER BY step")
        return self._matrix(rows)

    def param_metric(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, matrix[step, param]) of a sampled per-parameter metric (e.g. update_ratio)."""
        rows = self._query("SELECT step, data FROM param_metrics WHERE metric = ? ORDER BY step",
                           (metric,))
        return self._matrix(rows)

    def param_metric_names(self) -> list[str]:
        return [r[0] for r in self._query("SELECT DISTINCT metric FROM param_metrics")]

    def module_metric(self, metric: str) -> list[tuple[int, list[str], np.ndarray]]:
        """[(step, module names, values)] of a sampled per-module metric (e.g. act_maxabs)."""
        rows = self._query("SELECT step, names, data FROM module_metrics WHERE metric = ? "
                           "ORDER BY step", (metric,))
        return [(step, self._json(names, "module names"), _blob(data))
                for step, names, data in rows]

    def _matrix(self, rows: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
        width = len(self.param_names())
        steps = np.array([r[0] for r in rows], dtype=np.int64)
        matrix = np.full((len(rows), width), np.nan)
        for i, (_, data) in enumerate(rows):
            values = _blob(data)
            matrix[i, : min(width, values.size)] = values[:width]
        return steps, matrix

    def events(self) -> list[Event]:
        rows = self._query("SELECT step, kind, severity, param, value, message, details "
                           "FROM events ORDER BY id")
        return [Event(kind=kind, step=step, severity=severity, message=message, param=param,
                      value=self._json(value, "event value") if value is not None else None,
                      details=self._json(details, "event details"))
                for step, kind, severity, param, value, message, details in rows]

    # -- summary ------------------------------------------------------------------------------
    def summary(self, top: int = 5) -> dict[str, Any]:
        meta = self.meta()
        rows = self.steps()
        losses = [r.get("loss") for r in rows]
        finite = [x for x in losses if x is not None and math.isfinite(x)]
        names = self.param_names()
        _, grads = self.param_grad_norms()
        worst: list[dict[str, Any]] = []
        if grads.size:
            nonfinite = (~np.isfinite(grads)).sum(axis=0)
            peak = np.where(np.isfinite(grads), grads, -np.inf).max(axis=0)
            order = sorted(range(len(names)), key=lambda i: (-nonfinite[i], -peak[i]))[:top]
            worst = [{"param": names[i], "nonfinite_steps": int(nonfinite[i]),
                      "max_grad_norm": float(peak[i]) if math.isfinite(peak[i]) else None}
                     for i in order]
        events = self.events()
        return {
            "run_dir": str(self.run_dir),
            "status": meta.get("status", "unknown"),
            "trainguard_version": meta.get("trainguard_version"),
            "policy": meta.get("config", {}).get("policy"),
            "snapshot": meta.get("snapshot"),
            "diagnosis": meta.get("diagnosis", []),
            "preflight": meta.get("preflight", []),
            "steps": len(rows),
            "first_step": rows[0]["step"] if rows else None,
            "last_step": rows[-1]["step"] if rows else None,
            "loss": {
                "first": losses[0] if losses else None,
                "last": losses[-1] if losses else None,
                "min": min(finite) if finite else None,
                "nan": sum(1 for x in losses if x is not None and math.isnan(x)),
                "inf": sum(1 for x in losses if x is not None and math.isinf(x)),
            },
            "grad_norm_nonfinite_steps": sum(
                1 for r in rows if r.get("grad_norm") is not None
                and not math.isfinite(r["grad_norm"])),
            "actions": dict(Counter(r.get("action", "?") for r in rows)),
            "events_by_kind": dict(Counter(e.kind for e in events)),
            "events": [e.to_dict() for e in events],
            "worst_params": worst,
        }
