"""Real experiment trackers for the tests, offline: a W&B run in offline mode read back from its
own `.wandb` log (`wandb leet inspect --json`), and a local MLflow store (sqlite, made once per
test session: its first migration takes seconds) read back with `MlflowClient`. Nothing needs a
login or the network."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """W&B in offline mode, quiet, writing under a fresh folder (returned); any run left open
    by the test is finished."""
    folder = tmp_path / "wandb_runs"
    folder.mkdir()
    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
                        "WANDB_DIR": str(folder), "WANDB_PROJECT": "trainguard-tests",
                        "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true",
                        "WANDB_CONSOLE": "off", "WANDB_X_DISABLE_STATS": "true",
                        # artifacts are staged here, not in the user's home
                        "WANDB_DATA_DIR": str(folder / "data"),
                        "WANDB_CACHE_DIR": str(folder / "cache")}.items():
        monkeypatch.setenv(name, value)
    yield folder
    import wandb

    if wandb.run is not None:
        wandb.run.finish()


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One local sqlite MLflow store for the session, its tables made once, its default
    experiment's artifacts in the session's temporary folder (not the working directory)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    folder = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    SqlAlchemyStore(uri, (folder / "artifacts").as_uri())  # the migration, once
    return uri


@pytest.fixture
def mlflow_store(mlflow_uri: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The session's MLflow store as the tracking URI, no run left active after the test. An
    experiment a test makes by name needs an `artifact_location` of its own: MLflow's default
    is under the working directory."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    mlflow.set_tracking_uri(mlflow_uri)
    yield mlflow_uri
    while mlflow.active_run() is not None:
        mlflow.end_run()


@dataclass
class WandbRecords:
    """The records of an offline W&B run, as its `.wandb` log holds them."""

    records: list[dict[str, Any]]
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for record in self.records:
            kind = record.get("type")
            if kind == "history":
                self.history.append(record["history"]["item"])
            elif kind == "summary":
                self.summary.update(record["summary"].get("update", {}))
            elif kind == "alert":
                self.alerts.append(record["alert"])
            elif kind == "artifact":
                self.artifacts.append(record["artifact"])

    def rows_with(self, key: str) -> list[dict[str, Any]]:
        return [row for row in self.history if key in row]

    def at(self, axis: str, step: int, key: str) -> Any:
        """The value of `key` in the row logged at `axis` == `step` (exactly one)."""
        values = [row[key] for row in self.history if row.get(axis) == step and key in row]
        assert len(values) == 1, f"{key} at {axis}={step}: {values}"
        return values[0]


def wandb_records(run_dir: str | Path) -> WandbRecords:
    """Read a finished offline run's `.wandb` log with W&B's own reader."""
    wandb_cli = Path(sys.executable).with_name("wandb")
    out = subprocess.run([str(wandb_cli), "leet", "inspect", "--json", str(run_dir)],
                         capture_output=True, text=True, check=True, timeout=120,
                         env={**os.environ, "WANDB_SILENT": "true"})
    return WandbRecords([json.loads(line) for line in out.stdout.splitlines() if line.strip()])


def number(value: Any) -> float:
    """A W&B record's number (it writes NaN and inf as the strings "NaN", "Infinity")."""
    return float(value)


def is_nan(value: Any) -> bool:
    return math.isnan(number(value))
