"""MLflow runs in local stores: real runs logged here into an SQLite store and a file store,
stores shaped as MLflow writes them, the run a store of several stands for, bad input as one
line."""

from __future__ import annotations

import math
import shutil
import sqlite3
from pathlib import Path

import pytest

from trainguard.analyze import analyze, read_log
from trainguard.analyze.log import LogError

from .trackers import POISONED_AT, RAISED_AT, lightning_run, same_judgement, trainer_run

mlflow = pytest.importorskip("mlflow")


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite store: its first migration takes seconds, so it is made once and
    each test copies it."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def store(migrated_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store of this test's own, the tracking URI pointing at it."""
    path = tmp_path / "mlflow.db"
    shutil.copy(migrated_store, path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{path}")
    mlflow.set_tracking_uri(f"sqlite:///{path}")
    return path


def log_run(name: str, rows: list[dict[str, float]]) -> str:
    """A real MLflow run logging `rows` at steps 10, 20, ...; its id."""
    with mlflow.start_run(run_name=name) as run:
        for i, row in enumerate(rows):
            mlflow.log_metrics(row, step=10 * (i + 1))
    return run.info.run_id


def rows(nan_at: int = -1, inf_at: int = -1) -> list[dict[str, float]]:
    return [{"loss": math.nan if i == nan_at else math.inf if i == inf_at else 3.0 - i / 50,
             "learning_rate": 1e-3, "grad_norm": 1.0} for i in range(30)]


def test_the_sqlite_store_keeps_nan_as_zero_with_a_flag_and_inf_clamped_both_read_back(
        store: Path) -> None:
    run_id = log_run("one", rows(nan_at=8, inf_at=15))
    with sqlite3.connect(store) as db:  # what MLflow itself wrote
        stored = db.execute("SELECT value, is_nan FROM metrics WHERE key='loss' AND step IN "
                            "(90, 160) ORDER BY step").fetchall()
    assert stored[0] == (0.0, 1) and stored[1][0] > 1e308
    for path in (store, store.parent, f"sqlite:///{store}"):
        log = read_log(path)
        assert log.format == "mlflow" and log.steps == [10 * (i + 1) for i in range(30)]
        loss = log.values("loss")
        assert math.isnan(loss[8]) and loss[15] == math.inf
        assert sum(1 for v in loss if v is not None and not math.isfinite(v)) == 2
        assert set(log.series) == {"loss", "lr", "grad_norm"}
    assert read_log(store, run_id=run_id).steps[0] == 10
    result = analyze(store)
    assert result.kind == "nan" and result.onset_step == 90


def test_the_file_store_is_read_from_its_text_files(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri(f"file://{tmp_path / 'mlruns'}")
    log_run("files", [{**row, "train/moe_aux": 0.5} for row in rows(nan_at=4, inf_at=6)])
    for path in (tmp_path, tmp_path / "mlruns", f"file://{tmp_path / 'mlruns'}"):
        log = read_log(path)
        loss = log.values("loss")
        assert log.steps[:3] == [10, 20, 30] and math.isnan(loss[4]) and loss[6] == math.inf
        # a key with a `/` is a folder of the run's metrics
        assert log.values("grad_norm")[0] == 1.0 and log.values("moe_aux")[0] == 0.5


def test_the_newest_of_several_runs_is_read_and_named_and_run_id_picks_another(
        store: Path, capsys) -> None:
    from trainguard.cli import main

    first = log_run("first", rows(nan_at=3))
    second = log_run("second", rows())
    log = read_log(store)
    assert not any(math.isnan(v) for v in log.values("loss") if v is not None)
    assert any("2 MLflow runs" in note and second in note for note in log.notes)
    assert math.isnan(read_log(store, run_id=first).values("loss")[3])
    assert math.isnan(read_log(store, run_id="first").values("loss")[3])  # by its name
    for args in (["--run-id", "nosuch"], ["--run-id", first, "--format", "hf"]):
        code = main(["analyze", str(store), *args])
        captured = capsys.readouterr()
        assert code == 2 and captured.out == "" and captured.err.count("\n") == 1


@pytest.mark.parametrize("case", ["no runs", "tracking server", "unknown run id"])
def test_bad_input_is_one_line_and_exit_2(store: Path, case: str, capsys) -> None:
    from trainguard.cli import main

    if case == "unknown run id":
        log_run("one", rows())
    path = "http://localhost:5000" if case == "tracking server" else str(store)
    extra = ["--run-id", "0123abc"] if case == "unknown run id" else []
    code = main(["analyze", path, *extra])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.startswith("trainguard: error: ") and captured.err.count("\n") == 1
    expected = {"no runs": "no MLflow run with logged metrics",
                "tracking server": "a local MLflow store",
                "unknown run id": "'0123abc' is no run of it"}[case]
    assert expected in captured.err, captured.err


def file_run(root: Path, metrics: dict[str, list[tuple[int, float, int]]]) -> Path:
    """An `mlruns/<experiment>/<run>` folder as MLflow's file store writes it."""
    run = root / "mlruns" / "1" / "abc123"
    (run / "metrics").mkdir(parents=True)
    (run / "meta.yaml").write_text("run_id: abc123\nrun_name: shaped\nstart_time: 1000\n"
                                   "lifecycle_stage: active\n")
    for key, values in metrics.items():
        file = run / "metrics" / key
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text("".join(f"{ts} {value} {step}\n" for ts, value, step in values))
    return run


def test_the_hf_trainers_closing_totals_are_no_row(tmp_path: Path) -> None:
    """`MLflowCallback` logs the run's mean loss as `train_loss` at the last step, with
    `train_runtime`: read as that step's loss it would hide the last logged loss."""
    losses = [(100 + s, 2.0 - s / 10, s) for s in range(1, 11)]
    run = file_run(tmp_path, {"loss": losses, "grad_norm": [(t, 1.0, s) for t, _, s in losses],
                              "train_loss": [(500, 1.5, 10)], "train_runtime": [(500, 9.0, 10)],
                              "epoch": [(500, 1.0, 10)]})
    log = read_log(run)
    assert log.values("loss")[-1] == pytest.approx(1.0)
    assert any("closing totals" in note for note in log.notes)


def test_the_last_loss_logged_in_the_closing_totals_millisecond_is_kept(tmp_path: Path) -> None:
    """On a fast machine the last step's loss and `train_runtime` share a timestamp: the totals
    go, the loss and the learning rate stay a row."""
    losses = [(100 + s, 2.0 - s / 10, s) for s in range(1, 11)]
    run = file_run(tmp_path, {"loss": losses,
                              "learning_rate": [(t, 1e-3, s) for t, _, s in losses],
                              "train_loss": [(110, 1.5, 10)], "train_runtime": [(110, 9.0, 10)],
                              "train_samples_per_second": [(110, 4.0, 10)]})
    log = read_log(run)
    assert log.steps == list(range(1, 11))
    assert log.values("loss")[-1] == pytest.approx(1.0) and log.values("lr")[-1] == 1e-3
    assert "train_samples_per_second" not in log.series


def test_lightning_keys_and_values_logged_without_a_step(tmp_path: Path) -> None:
    stepped = file_run(tmp_path / "a", {"train_loss_step": [(100 + s, 2.0, s) for s in range(5)],
                                        "val_loss": [(200, 1.9, 4)]})
    log = read_log(stepped)
    assert log.steps == [0, 1, 2, 3, 4] and log.evals == [(4, {"val_loss": 1.9})]
    unstepped = file_run(tmp_path / "b", {"loss": [(100 + i, 2.0, 0) for i in range(6)]})
    log = read_log(unstepped)
    assert log.steps == list(range(6)) and any("no step given" in n for n in log.notes)


def test_an_sqlite_file_that_is_no_mlflow_store_is_not_read_as_one(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t (x)")
    with pytest.raises(LogError, match="not an MLflow store"):
        read_log(other, fmt="mlflow")


@pytest.mark.slow
def test_an_hf_trainer_run_reported_to_mlflow_is_judged_as_its_trainer_state(
        store: Path, tmp_path: Path) -> None:
    state = trainer_run(tmp_path / "out", ["mlflow"])
    from_state = analyze(state)
    from_mlflow = analyze(f"sqlite:///{store}")
    assert from_mlflow.format == "mlflow" and from_state.format == "hf"
    assert from_state.verdict != "healthy" and from_state.onset_step is not None
    assert from_state.onset_step >= RAISED_AT
    same_judgement(from_state, from_mlflow)


@pytest.mark.slow
def test_a_lightning_run_logged_with_mlflowlogger_is_judged_as_its_metrics_csv(
        store: Path, tmp_path: Path) -> None:
    from lightning.pytorch.loggers import MLFlowLogger

    logger = MLFlowLogger(experiment_name="lightning", tracking_uri=f"sqlite:///{store}")
    csv = lightning_run(tmp_path, logger)
    from_csv = analyze(csv)
    from_mlflow = analyze(store)
    assert from_mlflow.format == "mlflow" and from_csv.format == "lightning"
    assert from_mlflow.log is not None and from_csv.log is not None
    assert from_mlflow.log.steps == from_csv.log.steps
    assert from_csv.kind == "nan" and from_csv.onset_step == POISONED_AT
    same_judgement(from_csv, from_mlflow)
