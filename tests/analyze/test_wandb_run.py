"""W&B runs on disk: real offline runs made here, run logs and synced histories written as W&B
writes them, the run a folder of several stands for, bad input as one line."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.analyze import analyze, read_log
from trainguard.analyze.log import LogError
from trainguard.analyze.wandb_run import HISTORY_JSONL

from .trackers import POISONED_AT, RAISED_AT, lightning_run, same_judgement, trainer_run

wandb = pytest.importorskip("wandb")


def offline_run(root: Path, rows: list[dict[str, float]], monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real offline W&B run logging `rows`, one `run.log` each; its run directory."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(dir=str(root), project="trainguard-tests",
                     settings=wandb.Settings(console="off", x_disable_stats=True))
    for row in rows:
        run.log(row)
    run.finish()
    wandb.teardown()  # under pytest, finish() can return before the run's log is written
    return Path(run.dir).parent


def plain_rows(nan_at: int, inf_at: int) -> list[dict[str, float]]:
    return [{"loss": math.nan if i == nan_at else math.inf if i == inf_at else 2.0 - i / 100,
             "lr": 1e-3} for i in range(30)]


def test_a_plain_loop_logged_offline_keeps_its_nan_and_inf_at_w_and_b_own_steps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B writes a NaN as "NaN" and an inf as "Infinity" in its records: both stay what
    they were, at the `_step` W&B counted them at."""
    run_dir = offline_run(tmp_path, plain_rows(nan_at=12, inf_at=20), monkeypatch)
    assert run_dir.name.startswith("offline-run-") and list(run_dir.glob("run-*.wandb"))
    for path in (run_dir, next(run_dir.glob("*.wandb")), tmp_path / "wandb", tmp_path):
        log = read_log(path)
        assert log.format == "wandb" and log.steps == list(range(30))
        loss = log.values("loss")
        assert math.isnan(loss[12]) and loss[20] == math.inf
        assert sum(1 for v in loss if v is not None and not math.isfinite(v)) == 2
        assert log.values("lr")[0] == pytest.approx(1e-3)
    result = analyze(run_dir)
    assert result.verdict != "healthy" and result.onset_step == 12 and result.kind == "nan"


def test_the_latest_of_several_runs_is_read_and_named_and_run_id_picks_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = offline_run(tmp_path, plain_rows(nan_at=5, inf_at=-1), monkeypatch)
    second = offline_run(tmp_path, plain_rows(nan_at=-1, inf_at=-1), monkeypatch)
    log = read_log(tmp_path / "wandb")
    assert log.path == str(second.resolve()) or log.path == str(second)
    assert any("2 W&B runs" in note and second.name in note for note in log.notes)
    chosen = read_log(tmp_path / "wandb", run_id=first.name.rsplit("-", 1)[1])
    assert math.isnan(chosen.values("loss")[5])
    with pytest.raises(LogError, match="no W&B run 'nosuch'"):
        read_log(tmp_path / "wandb", run_id="nosuch")


# -- run logs and histories shaped as W&B writes them ------------------------------------------
def run_log(path: Path, records: list[dict[str, object]]) -> Path:
    """A `.wandb` log of history records, framed as W&B frames them (7-byte headers in blocks
    of 32 KiB, a record cut into pieces across blocks), the values as JSON text."""
    from wandb.proto import wandb_internal_pb2 as pb

    payloads = []
    for number, values in enumerate(records):
        record = pb.Record()
        record.history.step.num = number
        for key, value in values.items():
            item = record.history.item.add()
            item.nested_key.append(key)
            item.value_json = json.dumps(value)
        payloads.append(record.SerializeToString())
    block = 32768
    out = bytearray(b":W&B\xe1\xbe\x00")
    for payload in payloads:
        first = True
        while True:
            left = block - len(out) % block
            if left < 7:
                out += b"\0" * left
                continue
            piece, payload = payload[:left - 7], payload[left - 7:]
            kind = (1 if not payload else 2) if first else (4 if not payload else 3)
            out += struct.pack("<IHB", 0, len(piece), kind) + piece
            first = False
            if not payload:
                break
    path.write_bytes(bytes(out))
    return path


def hf_records(count: int, *, big: int = 0) -> list[dict[str, object]]:
    """Records as the HF Trainer's WandbCallback logs them: `train/` keys, `train/global_step`
    the step axis, W&B's own `_step` counting the calls, an evaluation record between."""
    records: list[dict[str, object]] = []
    for i in range(count):
        records.append({"train/loss": 3.0 - i / 50, "train/grad_norm": 1.0,
                        "train/learning_rate": 5e-5, "train/epoch": i / count,
                        "train/global_step": (i + 1) * 10, "_step": len(records),
                        "_runtime": float(i), "padding": "x" * big})
        if i == count // 2:
            records.append({"eval/loss": 2.5, "train/global_step": (i + 1) * 10,
                            "_step": len(records)})
    return records


def test_an_hf_run_log_is_read_at_train_global_step_with_its_evaluations(tmp_path: Path) -> None:
    log = read_log(run_log(tmp_path / "run-abc.wandb", hf_records(40)))
    assert log.steps == [10 * (i + 1) for i in range(40)]
    assert set(log.series) == {"loss", "grad_norm", "lr"}
    assert log.evals == [(210, {"eval/loss": 2.5})]


@pytest.mark.parametrize("cut", [0, 3, 20, 9000])
def test_records_cut_across_blocks_are_joined_and_a_cut_last_record_is_left_out(
        tmp_path: Path, cut: int) -> None:
    """Records of 9 kB: several of them cross a 32 KiB block; bytes cut off the end (a run
    still writing) lose the last record only, and say so."""
    path = run_log(tmp_path / "run-abc.wandb", hf_records(30, big=9000))
    assert path.stat().st_size > 8 * 32768
    if cut:
        path.write_bytes(path.read_bytes()[:-cut])
    log = read_log(path)
    assert log.steps == [10 * (i + 1) for i in range(30 if not cut else 29)]
    assert any("cut short" in note for note in log.notes) == bool(cut)


def test_a_synced_history_is_read_without_wandb(tmp_path: Path) -> None:
    """A run fetched from the server holds `files/wandb-history.jsonl`: read with `json`, NaN
    kept, and with wandb hidden, nothing of it is imported."""
    run = tmp_path / "run-20250101_120000-abc123"
    (run / "files").mkdir(parents=True)
    lines = [json.dumps({"trainer/global_step": 50 * i, "train_loss_step": 2.0 - i / 20,
                         "epoch": 0, "_step": i}) for i in range(20)]
    lines[7] = lines[7].replace("1.65", "NaN")
    (run / HISTORY_JSONL).write_text("\n".join(lines) + "\n")
    code = (f"import sys; sys.modules['wandb'] = None\n"
            f"from trainguard.analyze import read_log\n"
            f"log = read_log({str(run)!r})\n"
            f"print(log.format, log.steps[7], log.values('loss')[7], 'wandb' in sys.modules "
            f"and sys.modules['wandb'] is not None)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split() == ["wandb", "350", "nan", "False"], done.stderr


def test_a_run_log_without_wandb_names_what_to_install(tmp_path: Path) -> None:
    path = run_log(tmp_path / "run-abc.wandb", hf_records(10))
    code = ("import sys; sys.modules['wandb'] = None\n"
            f"from trainguard.cli import main; sys.exit(main(['analyze', {str(path)!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "pip install wandb" in done.stderr, done.stderr


@pytest.mark.parametrize("layout", ["empty wandb folder", "run without history",
                                    "not a run log"])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, layout: str, capsys) -> None:
    from trainguard.cli import main

    if layout == "empty wandb folder":
        (tmp_path / "wandb").mkdir()
        args = [str(tmp_path / "wandb"), "--format", "wandb"]
    elif layout == "run without history":
        (tmp_path / "offline-run-20250101_120000-abc" / "logs").mkdir(parents=True)
        args = [str(tmp_path / "offline-run-20250101_120000-abc"), "--format", "wandb"]
    else:
        (tmp_path / "run-x.wandb").write_bytes(b"not a log at all")
        args = [str(tmp_path / "run-x.wandb")]
    code = main(["analyze", *args])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.startswith("trainguard: error: ") and captured.err.count("\n") == 1


@pytest.mark.slow
def test_an_hf_trainer_run_reported_to_wandb_is_judged_as_its_trainer_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_DISABLE_CODE", "true")
    state = trainer_run(tmp_path / "out", ["wandb"])
    from_state = analyze(state)
    from_wandb = analyze(tmp_path / "wandb")
    assert from_wandb.format == "wandb" and from_state.format == "hf"
    assert from_state.verdict != "healthy" and from_state.onset_step is not None
    assert from_state.onset_step >= RAISED_AT
    same_judgement(from_state, from_wandb)


@pytest.mark.slow
def test_a_lightning_run_logged_with_wandblogger_is_judged_as_its_metrics_csv(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(save_dir=str(tmp_path), offline=True, project="trainguard-tests")
    csv = lightning_run(tmp_path, logger)
    wandb.finish()
    wandb.teardown()  # finish() can return before the run log is written
    from_csv = analyze(csv)
    from_wandb = analyze(tmp_path / "wandb")
    assert from_wandb.format == "wandb" and from_csv.format == "lightning"
    assert from_wandb.log is not None and from_csv.log is not None
    assert from_wandb.log.steps == from_csv.log.steps  # trainer/global_step, not _step
    assert from_csv.kind == "nan" and from_csv.onset_step == POISONED_AT
    same_judgement(from_csv, from_wandb)
