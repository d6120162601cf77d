"""One reader per log format, on small logs written here: rows, steps, canonical series, evals,
labels, NaN/inf kept, format detection by `read_log` and forcing with `fmt`, and clear errors."""

from __future__ import annotations

import json
import math
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from trainguard.analyze import FORMATS, analyze_log, read_log
from trainguard.analyze.log import Log, LogError

from .logs import event_file

NAN = math.nan


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def same(values: list[float | None], expected: list[float | None]) -> bool:
    """Element-wise equality where NaN equals NaN and None equals None."""
    if len(values) != len(expected):
        return False
    for got, want in zip(values, expected, strict=True):
        if want is None or got is None:
            if got is not want:
                return False
        elif math.isnan(want):
            if not math.isnan(got):
                return False
        elif got != pytest.approx(want, rel=1e-6):
            return False
    return True


# -- Hugging Face trainer_state.json --------------------------------------------------------------
HISTORY = [
    {"epoch": 0.1, "grad_norm": 1.5, "learning_rate": 1e-4, "loss": 2.5, "step": 10},
    {"epoch": 0.2, "grad_norm": 1.25, "learning_rate": 9e-5, "loss": 2.0, "step": 20},
    {"epoch": 0.2, "eval_loss": 1.9, "eval_runtime": 3.5, "step": 20},
    {"epoch": 0.3, "grad_norm": NAN, "learning_rate": 8e-5, "loss": 1.75, "step": 30},
    {"epoch": 0.4, "grad_norm": math.inf, "learning_rate": 7e-5, "loss": NAN, "step": 40,
     "mean_token_accuracy": 0.5},
    {"epoch": 0.4, "total_flos": 1e12, "train_loss": 2.1, "train_runtime": 12.0,
     "train_samples_per_second": 3.0},
]


def trainer_state(path: Path, history: list[dict] = HISTORY) -> Path:
    state = {"global_step": 40, "logging_steps": 10, "log_history": history}
    return write(path, json.dumps(state, indent=2))  # NaN / Infinity as the Trainer writes them


def test_hf_rows_series_and_evals(tmp_path: Path) -> None:
    path = trainer_state(tmp_path / "trainer_state.json")
    log = read_log(path)
    assert log.format == "hf" and log.path == str(path)
    assert log.steps == [10, 20, 30, 40]
    assert same(log.series["loss"], [2.5, 2.0, 1.75, NAN])
    assert same(log.series["grad_norm"], [1.5, 1.25, NAN, math.inf])
    assert same(log.series["lr"], [1e-4, 9e-5, 8e-5, 7e-5])
    assert same(log.series["mean_token_accuracy"], [None, None, None, 0.5])
    assert "learning_rate" not in log.series and "epoch" not in log.series
    assert "total_flos" not in log.series and "train_runtime" not in log.series
    assert log.evals == [(20, {"eval_loss": 1.9, "eval_runtime": 3.5})]
    assert log.label(0) == "step 10" and log.interval() == 10.0
    assert log.has("grad_norm") and not log.has("loss_scale")


def test_hf_detected_in_a_run_directory_from_its_latest_checkpoint(tmp_path: Path) -> None:
    trainer_state(tmp_path / "out" / "checkpoint-500" / "trainer_state.json", HISTORY[:2])
    latest = trainer_state(tmp_path / "out" / "checkpoint-1000" / "trainer_state.json")
    trainer_state(tmp_path / "out" / "checkpoint-final" / "trainer_state.json", HISTORY[:1])
    log = read_log(tmp_path / "out")
    assert log.format == "hf" and log.path == str(latest) and len(log) == 4
    assert read_log(tmp_path / "out", "hf").path == str(latest)


def test_hf_detected_by_content_whatever_the_name(tmp_path: Path) -> None:
    path = trainer_state(tmp_path / "state.txt")
    assert read_log(path).format == "hf"


def test_hf_closing_totals_do_not_change_the_last_row(tmp_path: Path) -> None:
    history = [dict(entry, step=entry.get("step", 40)) for entry in HISTORY]
    log = read_log(trainer_state(tmp_path / "trainer_state.json", history))
    assert log.steps == [10, 20, 30, 40]
    assert same(log.series["loss"], [2.5, 2.0, 1.75, NAN])


@pytest.mark.parametrize("cut_after", ['"learning_rate": 8e-05, "lo', '"grad_norm": Na',
                                       '"loss": 1.75', '"grad_norm": Infin', "[", '"epoch": 0.3,'])
def test_hf_truncated_json_names_the_file_and_says_truncated(tmp_path: Path,
                                                             cut_after: str) -> None:
    text = json.dumps({"log_history": HISTORY})
    path = write(tmp_path / "trainer_state.json", text[:text.index(cut_after) + len(cut_after)])
    with pytest.raises(LogError) as info:
        read_log(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "truncated" in message and "damaged" not in message
    with pytest.raises(LogError, match="truncated"):
        read_log(path, "hf")


def test_hf_json_damaged_inside_says_damaged(tmp_path: Path) -> None:
    text = json.dumps({"log_history": HISTORY}).replace('"loss": 2.0', '"loss": 2..0')
    path = write(tmp_path / "trainer_state.json", text)
    with pytest.raises(LogError) as info:
        read_log(path)
    assert str(path) in str(info.value) and "damaged" in str(info.value)
    assert "truncated" not in str(info.value)


@pytest.mark.parametrize("state, fragment", [
    ({"global_step": 3}, "no log_history"),
    ({"log_history": {"step": 1}}, "log_history is dict"),
    ({"log_history": [{"loss": 1.0}]}, "entry 0 has no whole-number step"),
    ({"log_history": [{"step": 1, "epoch": 0.1}]}, "no training entries"),
])
def test_hf_not_a_trainer_state_is_a_clear_error(tmp_path: Path, state: dict,
                                                 fragment: str) -> None:
    path = write(tmp_path / "trainer_state.json", json.dumps(state))
    with pytest.raises(LogError, match=fragment) as info:
        read_log(path)
    assert str(path) in str(info.value)


# -- Lightning metrics.csv ------------------------------------------------------------------------
METRICS_CSV = """\
epoch,lr-AdamW,step,train_loss_epoch,train_loss_step,val_acc,val_loss
0,0.001,9,,2.5,,
0,0.001,19,,2.0,,
0,,19,,,0.5,1.9
0,,19,2.25,,,
1,0.0005,29,,nan,,
1,0.0005,39,,inf,,
1,,39,,,0.25,2.5
"""


def test_lightning_train_and_val_rows(tmp_path: Path) -> None:
    path = write(tmp_path / "metrics.csv", METRICS_CSV)
    log = read_log(path)
    assert log.format == "lightning"
    assert log.steps == [9, 19, 29, 39]
    assert same(log.series["loss"], [2.5, 2.0, NAN, math.inf])
    assert same(log.series["lr"], [1e-3, 1e-3, 5e-4, 5e-4])
    assert "train_loss_epoch" not in log.series, "the epoch aggregate repeats the step losses"
    assert log.evals == [(19, {"val_acc": 0.5, "val_loss": 1.9}),
                         (39, {"val_acc": 0.25, "val_loss": 2.5})]
    assert log.labels == ["epoch 0 (step 9)", "epoch 0 (step 19)", "epoch 1 (step 29)",
                          "epoch 1 (step 39)"]
    assert log.label(2) == "epoch 1 (step 29)"


def test_lightning_detected_in_the_latest_version_directory(tmp_path: Path) -> None:
    write(tmp_path / "lightning_logs" / "version_2" / "metrics.csv", METRICS_CSV)
    latest = write(tmp_path / "lightning_logs" / "version_10" / "metrics.csv",
                   "epoch,step,train_loss\n0,0,1.5\n0,1,1.25\n")
    log = read_log(tmp_path / "lightning_logs")
    assert log.format == "lightning" and log.path == str(latest) and log.steps == [0, 1]
    assert same(log.series["loss"], [1.5, 1.25])


def test_lightning_epoch_level_only_keeps_the_epoch_loss(tmp_path: Path) -> None:
    path = write(tmp_path / "metrics.csv",
                 "epoch,step,train_loss_epoch,val_loss\n0,99,2.0,\n0,99,,2.5\n1,199,1.5,\n")
    log = read_log(path)
    assert log.steps == [99, 199] and same(log.series["loss"], [2.0, 1.5])
    assert log.notes == ["train_loss_epoch is read as the training loss"]
    assert log.evals == [(99, {"val_loss": 2.5})]


def test_lightning_a_last_line_cut_short_is_left_out(tmp_path: Path) -> None:
    path = write(tmp_path / "metrics.csv", "epoch,step,train_loss\n0,0,1.5\n0,1,1.25\n0,2")
    log = read_log(path)
    assert log.steps == [0, 1] and "incomplete" in log.notes[0]


def test_lightning_a_csv_without_a_step_column_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "metrics.csv", "loss,epoch\n1.5,0\n")
    with pytest.raises(LogError, match="no 'step' column") as info:
        read_log(path, "lightning")
    assert str(path) in str(info.value)


def test_a_csv_without_a_step_column_is_read_as_its_header_table(tmp_path: Path) -> None:
    # a baselines / GAIL `progress.csv`: a header of names, one row per update, no step column
    rows = [f"{0.7 - 0.01 * i:.3f},{10.0 / (i + 1) + (30.0 if i == 5 else 0.0):.4f},"
            f"{20 + 3 * i},{1e-4 * (i % 3):.5f}" for i in range(12)]
    path = write(tmp_path / "progress.csv", "\n".join(
        ["discriminator loss,loss,mean 100 episode reward,kl", *rows]) + "\n")
    log = read_log(path)
    assert log.format == "text:table" and len(log.steps) == 12
    assert log.values("loss")[5] == pytest.approx(10.0 / 6 + 30.0, abs=1e-4)  # as written


# -- JSON Lines -----------------------------------------------------------------------------------
JSONL = """\
{"step": 1, "loss": 2.5, "learning_rate": 0.001, "grad_norm": 1.0, "epoch": 0.1}
{"step": 2, "loss": NaN, "learning_rate": 0.001, "grad_norm": Infinity}
{"step": 2, "eval_loss": 2.75, "eval_accuracy": 0.5}
{"step": 3, "train/loss": 1.5, "lr": 0.0005, "note": "text is ignored"}
"""


def test_jsonl_rows_nonfinite_values_and_evals(tmp_path: Path) -> None:
    path = write(tmp_path / "log.jsonl", JSONL)
    log = read_log(path)
    assert log.format == "jsonl" and log.steps == [1, 2, 3]
    assert same(log.series["loss"], [2.5, NAN, 1.5])
    assert same(log.series["grad_norm"], [1.0, math.inf, None])
    assert same(log.series["lr"], [1e-3, 1e-3, 5e-4])
    assert set(log.series) == {"loss", "lr", "grad_norm"}
    assert log.evals == [(2, {"eval_loss": 2.75, "eval_accuracy": 0.5})]
    assert log.notes == []


def test_jsonl_detected_by_content_whatever_the_name(tmp_path: Path) -> None:
    assert read_log(write(tmp_path / "trainer_log.txt", JSONL)).format == "jsonl"


def test_jsonl_a_malformed_line_names_the_file_and_line(tmp_path: Path) -> None:
    lines = JSONL.splitlines()
    lines[1] = '{"step": 2, "loss": oops}'
    path = write(tmp_path / "log.jsonl", "\n".join(lines) + "\n")
    with pytest.raises(LogError, match="line 2 is not valid JSON") as info:
        read_log(path)
    assert str(path) in str(info.value)


def test_jsonl_a_line_that_is_not_an_object_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "log.jsonl", '{"step": 1, "loss": 2.0}\n[1, 2]\n')
    with pytest.raises(LogError, match="line 2 is list"):
        read_log(path)


def test_jsonl_a_last_line_cut_short_is_left_out_with_a_note(tmp_path: Path) -> None:
    path = write(tmp_path / "log.jsonl", JSONL + '{"step": 4, "lo')
    log = read_log(path)
    assert log.steps == [1, 2, 3]
    assert log.notes == ["the last line (5) is cut short (the file was being written); it is "
                         "left out"]


def test_jsonl_lines_without_a_step_are_numbered(tmp_path: Path) -> None:
    path = write(tmp_path / "log.jsonl", '{"loss": 2.0}\n{"loss": 1.5}\n{"_step": 7, "loss": 1}\n')
    log = read_log(path)
    assert log.steps == [0, 1, 7] and same(log.series["loss"], [2.0, 1.5, 1.0])
    assert "numbered by their line" in log.notes[-1]


# -- TensorBoard ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tb_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory written by torch.utils.tensorboard: train scalars (a NaN loss at step 3),
    an eval tag, a histogram (skipped by the reader) and a Keras-style validation subdirectory."""
    torch = pytest.importorskip("torch")
    tensorboard = pytest.importorskip("torch.utils.tensorboard")
    run = tmp_path_factory.mktemp("tb") / "run"
    writer = tensorboard.SummaryWriter(log_dir=str(run))
    for step in range(5):
        writer.add_scalar("train/loss", NAN if step == 3 else 2.0 - 0.25 * step, step)
        writer.add_scalar("train/learning_rate", 1e-3 * 0.5 ** step, step)
        writer.add_scalar("train/grad_norm", math.inf if step == 4 else 1.0 + step, step)
        writer.add_scalar("train/epoch", step / 5, step)
        if step % 2 == 0:
            writer.add_scalar("Loss/val", 3.0 - step, step)
        writer.add_histogram("weights", torch.arange(4.0), step)
    writer.close()
    validation = tensorboard.SummaryWriter(log_dir=str(run / "validation"))
    validation.add_scalar("accuracy", 0.75, 4)
    validation.close()
    return run


def test_tensorboard_run_directory_scalars_nan_and_evals(tb_run: Path) -> None:
    log = read_log(tb_run)
    assert log.format == "tensorboard" and log.path == str(tb_run)
    assert log.steps == [0, 1, 2, 3, 4]
    assert same(log.series["loss"], [2.0, 1.75, 1.5, NAN, 1.0])
    assert same(log.series["lr"], [1e-3 * 0.5 ** s for s in range(5)])
    assert same(log.series["grad_norm"], [1.0, 2.0, 3.0, 4.0, math.inf])
    assert set(log.series) == {"loss", "lr", "grad_norm"}, "epoch is bookkeeping"
    assert log.evals == [(0, {"Loss/val": 3.0}), (2, {"Loss/val": 1.0}),
                         (4, {"Loss/val": -1.0, "eval/accuracy": 0.75})]
    assert log.notes == []
    assert read_log(tb_run, "tensorboard").steps == log.steps


def test_tensorboard_a_single_event_file(tb_run: Path, tmp_path: Path) -> None:
    (event,) = tb_run.glob("events.out.tfevents.*")
    log = read_log(event)
    assert log.format == "tensorboard" and log.steps == [0, 1, 2, 3, 4]
    assert same(log.series["loss"], [2.0, 1.75, 1.5, NAN, 1.0])
    renamed = tmp_path / "scalars.bin"  # no `tfevents` in the name: found by its TFRecord framing
    renamed.write_bytes(event.read_bytes())
    assert read_log(renamed).format == "tensorboard"


def test_tensorboard_a_file_cut_inside_a_record_reads_its_complete_records(tb_run: Path,
                                                                         tmp_path: Path) -> None:
    (event,) = tb_run.glob("events.out.tfevents.*")
    cut = tmp_path / event.name
    cut.write_bytes(event.read_bytes()[:-7])
    log = read_log(cut)
    assert log.steps == [0, 1, 2, 3, 4] and "ends inside a record" in log.notes[0]


def test_tensorboard_a_damaged_record_is_an_error(tb_run: Path, tmp_path: Path) -> None:
    (event,) = tb_run.glob("events.out.tfevents.*")
    data = bytearray(event.read_bytes())
    at = data.index(struct.pack("<f", 1.75))  # the loss at step 1, inside a scalar's record
    data[at] ^= 0x01  # a different value, of the same shape: only its CRC tells
    damaged = tmp_path / event.name
    damaged.write_bytes(bytes(data))
    with pytest.raises(LogError, match="damaged") as info:
        read_log(damaged)
    assert str(damaged) in str(info.value)


def test_tensorboard_an_empty_directory_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "runs"
    empty.mkdir()
    with pytest.raises(LogError) as forced:
        read_log(empty, "tensorboard")
    assert str(forced.value) == (f"{empty}: no TensorBoard event files (events.out.tfevents.*) "
                                 "in it")
    with pytest.raises(LogError) as detected:
        read_log(empty)
    assert str(detected.value).startswith(f"{empty}: no training log in this directory")
    assert "TensorBoard event files" in str(detected.value)


def test_tensorboard_a_directory_of_several_runs_is_an_error(tb_run: Path, tmp_path: Path) -> None:
    (event,) = tb_run.glob("events.out.tfevents.*")
    for name in ("run_a", "run_b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / event.name).write_bytes(event.read_bytes())
    with pytest.raises(LogError, match="holds 2 TensorBoard runs"):
        read_log(tmp_path)


# -- trainguard's own run store -------------------------------------------------------------------
@pytest.fixture(scope="module")
def store_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[str, float]]]:
    """A real guarded run of a tiny nn.Linear: 6 steps, a NaN loss at step 3, one evaluation."""
    torch = pytest.importorskip("torch")
    from trainguard import Guard, GuardConfig

    run_dir = tmp_path_factory.mktemp("store") / "run"
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    reports = []
    with Guard(model, optimizer, scheduler, run_dir=run_dir,
               config=GuardConfig(sinks={"console": False}, probes={"preflight": False})) as guard:
        for step in range(6):
            x = torch.randn(8, 4)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            if step == 3:
                loss = loss * NAN
            loss.backward()
            report = guard.step(loss)
            reports.append((report.action, report.loss))
            optimizer.zero_grad(set_to_none=True)
        guard.observe_eval({"eval_loss": 0.5, "accuracy": 0.875})
    return run_dir, reports


def test_store_rows_from_a_real_guarded_run(store_run: tuple[Path, list[tuple[str, float]]],
                                            ) -> None:
    run_dir, reports = store_run
    log = read_log(run_dir)
    assert log.format == "store" and log.path == str(run_dir)
    assert log.steps == list(range(6))
    assert same(log.series["loss"], [loss for _, loss in reports])
    assert math.isnan(log.series["loss"][3]) and math.isnan(log.series["grad_norm"][3])
    assert reports[3][0] == "skipped"
    assert all(g > 0 for i, g in enumerate(log.series["grad_norm"]) if i != 3)
    # StepLR halves every 2 applied steps; the skipped step 3 does not advance it
    assert same(log.series["lr"], [0.05, 0.05, 0.025, 0.025, 0.025, 0.0125])
    assert log.evals == [(5, {"eval_loss": 0.5, "eval_accuracy": 0.875})]
    assert log.param_names == ["weight", "bias"]
    assert log.param_grad_norms.shape == (6, 2)
    assert isinstance(log.detector_config, dict) and "loss_spike" in log.detector_config
    assert log.interval() == 1.0


def test_store_read_from_its_database_file_and_forced(
        store_run: tuple[Path, list[tuple[str, float]]]) -> None:
    run_dir, _ = store_run
    by_db = read_log(run_dir / "trainguard.db")
    assert by_db.format == "store" and by_db.path == str(run_dir) and by_db.steps == list(range(6))
    assert read_log(run_dir, "store").steps == list(range(6))


def test_store_forced_on_a_directory_without_a_store_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(LogError) as info:
        read_log(tmp_path, "store")
    assert str(tmp_path) in str(info.value)


# -- text logs ------------------------------------------------------------------------------------
MEGATRON = """\
[default7]: iteration       10/     100 | consumed samples:          320 | elapsed time per iteration (ms): 100.0 | learning rate: 6.000E-05 | global batch size:    32 | lm loss: 1.142026E+01 | loss scale: 4096.0 | grad norm: 21.978 | number of skipped iterations:   0 | number of nan iterations:   0 |
[2024-01-01 00:00:00] [INFO] [stage_1_and_2.py:1800:step] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 4096, reducing to 2048
[default7]: iteration       20/     100 | consumed samples:          640 | elapsed time per iteration (ms): 100.0 | learning rate: 6.000E-05 | global batch size:    32 | lm loss: 1.052026E+01 | loss scale: 2048.0 | grad norm: 19.000 | number of skipped iterations:   0 | number of nan iterations:   0 |
[default7]: iteration       30/     100 | consumed samples:          960 | elapsed time per iteration (ms): 100.0 | learning rate: 5.000E-05 | global batch size:    32 | lm loss: nan | loss scale: 2048.0 | grad norm: inf | number of skipped iterations:   1 | number of nan iterations:   1 |
 validation loss at iteration 30 | lm loss value: 1.000000E+01 | lm loss PPL: 2.2E+04 |
 iteration       40/     100 | consumed samples:         1280 | elapsed time per iteration (ms): 100.0 | learning rate: 4.000E-05 | global batch size:    32 | lm loss: 9.500000E+00 | loss scale: 2048.0 | grad norm: 15.000 | number of skipped iterations:   0 | number of nan iterations:   0 |
"""  # noqa: E501


def test_text_megatron(tmp_path: Path) -> None:
    path = write(tmp_path / "train.log", MEGATRON)
    log = read_log(path)
    assert log.format == "text:megatron" and log.step_unit == "iteration"
    assert log.steps == [10, 20, 30, 40]
    assert same(log.series["loss"], [11.42026, 10.52026, NAN, 9.5])
    assert same(log.series["grad_norm"], [21.978, 19.0, math.inf, 15.0])
    assert same(log.series["lr"], [6e-5, 6e-5, 5e-5, 4e-5])
    assert same(log.series["loss_scale"], [4096.0, 2048.0, 2048.0, 2048.0])
    assert set(log.series) == {"loss", "grad_norm", "lr", "loss_scale"}
    assert log.skipped == [False, True, True, False], "an OVERFLOW message, then a counter"
    assert log.evals == [(30, {"validation lm loss": 10.0})]
    assert log.label(2) == "iteration 30"


WLM = """\
| epoch   1 |   200/  400 batches | lr 20.00 | ms/batch 11.96 | loss  7.10 | ppl  1212.00
| epoch   1 |   400/  400 batches | lr 20.00 | ms/batch 11.96 | loss  6.50 | ppl   665.14
-----------------------------------------------------------------------------------------
| end of epoch   1 | time: 50.00s | valid loss  6.33 | valid ppl   561.20
-----------------------------------------------------------------------------------------
| epoch   2 |   200/  400 batches | lr 20.00 | ms/batch 11.96 | loss  6.20 | ppl   492.75
| epoch   4 |  1400/ 2983 batches | lr 5.00 | ms/batch 11.96 | loss   nan | ppl      nan
"""


def test_text_word_language_model(tmp_path: Path) -> None:
    path = write(tmp_path / "notes.md", "# training notes\n\n```\n" + WLM + "```\n")
    log = read_log(path)
    assert log.format == "text:wlm" and log.step_unit == "batch"
    assert log.steps == [200, 400, 600, 3 * 2983 + 1400], "(epoch - 1) x batches + batch"
    assert log.labels == ["epoch 1, batch 200", "epoch 1, batch 400", "epoch 2, batch 200",
                          "epoch 4, batch 1400"]
    assert log.label(3) == "epoch 4, batch 1400"
    assert same(log.series["loss"], [7.1, 6.5, 6.2, NAN])
    assert same(log.series["lr"], [20.0, 20.0, 20.0, 5.0])
    assert same(log.series["ppl"], [1212.0, 665.14, 492.75, NAN])
    assert log.evals == [(400, {"valid loss": 6.33})]


NANOGPT = """\
step 0: train loss 4.2000, val loss 4.2100
iter 0: loss 4.2000, time 1000.00ms, mfu -100.00%
iter 10: loss 3.5000, time 101.12ms, mfu 14.12%
step 20: train loss 3.1000, val loss 3.2000
iter 20: loss 3.0000, time 101.12ms, mfu 14.12%
iter 3010: loss nan, time 1019.95ms, mfu 14.12%
"""


def test_text_nanogpt(tmp_path: Path) -> None:
    log = read_log(write(tmp_path / "out.txt", NANOGPT))
    assert log.format == "text:nanogpt" and log.step_unit == "iter"
    assert log.steps == [0, 10, 20, 3010]
    assert same(log.series["loss"], [4.2, 3.5, 3.0, NAN])
    assert set(log.series) == {"loss"}, "time and mfu are not training signals"
    assert log.evals == [(0, {"val loss": 4.21}), (20, {"val loss": 3.2})]
    assert log.label(3) == "iter 3010"


MLX = """\
Iter 1: Val loss 2.900, Val took 1.200s
Iter 10: Train loss 2.123, Learning Rate 1.000e-05, It/sec 1.234, Tokens/sec 500.000, Trained Tokens 1000, Peak mem 5.000 GB
Iter 20: Train loss inf, Learning Rate 2.000e-05, It/sec 1.200, Tokens/sec 500.000, Trained Tokens 2000, Peak mem 5.000 GB
Iter 20: Val loss 2.500, Val took 1.100s
"""  # noqa: E501


def test_text_mlx(tmp_path: Path) -> None:
    log = read_log(write(tmp_path / "mlx.log", MLX))
    assert log.format == "text:mlx"
    assert log.steps == [10, 20]
    assert same(log.series["loss"], [2.123, math.inf])
    assert same(log.series["lr"], [1e-5, 2e-5])
    assert set(log.series) == {"loss", "lr"}
    assert log.evals == [(1, {"val loss": 2.9}), (20, {"val loss": 2.5})]


LLMC = """\
s:0 tel:10.8125
s:0 trl:10.8250 lr:0.000001 norm:12.50
s:1 trl:10.7500 lr:0.000002 norm:11.25
s:250 tel:4.1021
s:250 eval:0.2540
s:250 trl:nan lr:0.000250 norm:nan
"""


def test_text_llmc(tmp_path: Path) -> None:
    log = read_log(write(tmp_path / "main.log", LLMC))
    assert log.format == "text:llmc" and log.steps == [0, 1, 250]
    assert same(log.series["loss"], [10.825, 10.75, NAN])
    assert same(log.series["grad_norm"], [12.5, 11.25, NAN])
    assert same(log.series["lr"], [1e-6, 2e-6, 2.5e-4])
    assert log.evals == [(0, {"val loss": 10.8125}),
                         (250, {"val loss": 4.1021, "eval hellaswag acc": 0.254})]


GENERIC = """\
2024-05-01 12:00:00 global_step=120 loss=2.31 learning_rate=0.0003 grad_norm=0.5 val_loss=2.5
some other line with step 5 but no such value
step 130 | loss inf | lr 3e-4 | gnorm 0.87
step: 140, loss: nan, lr: 3e-4, grad-norm: 1.25
"""


def test_text_generic(tmp_path: Path) -> None:
    log = read_log(write(tmp_path / "train.log", GENERIC))
    assert log.format == "text:generic" and log.step_unit == "step"
    assert log.steps == [120, 130, 140]
    assert same(log.series["loss"], [2.31, math.inf, NAN])
    assert same(log.series["lr"], [3e-4, 3e-4, 3e-4])
    assert same(log.series["grad_norm"], [0.5, 0.87, 1.25])
    assert log.evals == [(120, {"val_loss": 2.5})]


def test_text_a_trainer_grammar_beats_the_generic_one(tmp_path: Path) -> None:
    """nanoGPT lines match the generic pattern too; a trainer's own grammar reads the file, and
    the generic one only when forced."""
    path = write(tmp_path / "out.txt", NANOGPT)
    assert read_log(path).format == "text:nanogpt"
    forced = read_log(path, "text:generic")
    assert forced.format == "text:generic" and forced.evals == []
    assert same(forced.series["loss"], [4.2, 3.5, 3.0, NAN])
    assert read_log(path, "text").format == "text:nanogpt"


@pytest.mark.parametrize("fmt, text, expected", [
    ("text:megatron", MEGATRON, [10, 20, 30, 40]), ("text:wlm", WLM, [200, 400, 600, 10349]),
    ("text:nanogpt", NANOGPT, [0, 10, 20, 3010]), ("text:mlx", MLX, [10, 20]),
    ("text:generic", GENERIC, [120, 130, 140]),
])
def test_text_each_grammar_forced(tmp_path: Path, fmt: str, text: str,
                                  expected: list[int]) -> None:
    log = read_log(write(tmp_path / "any.log", text), fmt)
    assert log.format == fmt and log.steps == expected


def test_text_a_grammar_forced_on_other_lines_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "out.txt", NANOGPT)
    with pytest.raises(LogError,
                       match=r"no training log lines recognised \(looked for mlx") as info:
        read_log(path, "text:mlx")
    assert str(path) in str(info.value)


def test_text_without_recognised_lines_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "notes.txt", "hello\nloading the dataset\nstep 3 done, no value\n")
    with pytest.raises(LogError) as info:
        read_log(path)
    message = str(info.value)
    assert message.startswith(f"{path}: no training log lines recognised")
    assert all(name in message for name in ("megatron", "wlm", "nanogpt", "mlx", "generic"))


def test_text_a_binary_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "blob.bin"
    path.write_bytes(b"\x00\x01\x02binary" * 20)
    with pytest.raises(LogError, match="binary file"):
        read_log(path)


# -- read_log: detection, forcing and its own errors ----------------------------------------------
def test_every_documented_format_can_be_forced() -> None:
    assert {"hf", "lightning", "tensorboard", "store", "jsonl", "text"} <= set(FORMATS)
    from trainguard.analyze.text import GRAMMARS

    assert {f"text:{g}" for g in GRAMMARS} <= set(FORMATS), "every text grammar can be forced"


def test_a_forced_format_reads_a_file_detection_would_give_to_another(tmp_path: Path) -> None:
    path = write(tmp_path / "log.jsonl", '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n')
    assert read_log(path).format == "jsonl"
    with pytest.raises(LogError, match="not valid JSON"):
        read_log(path, "hf")
    state = trainer_state(tmp_path / "trainer_state.json")
    with pytest.raises(LogError, match="line 1 is not valid JSON"):
        read_log(state, "jsonl")
    with pytest.raises(LogError, match="no 'step' column"):
        read_log(path, "lightning")


@pytest.mark.parametrize("fmt, fragment", [("lightning", "metrics.csv"), ("jsonl", "directory")])
def test_a_file_format_forced_on_a_directory_is_an_error(tmp_path: Path, fmt: str,
                                                         fragment: str) -> None:
    with pytest.raises(LogError, match=fragment):
        read_log(tmp_path, fmt)


def test_read_log_errors(tmp_path: Path) -> None:
    with pytest.raises(LogError, match="no such file or directory"):
        read_log(tmp_path / "missing.json")
    empty = write(tmp_path / "empty.log", "  \n")
    with pytest.raises(LogError, match="the file is empty") as info:
        read_log(empty)
    assert str(empty) in str(info.value)
    with pytest.raises(LogError, match="unknown format 'csv'"):
        read_log(empty, "csv")


def test_a_log_is_what_every_reader_returns(tmp_path: Path) -> None:
    logs = [read_log(write(tmp_path / "trainer_state.json", json.dumps({"log_history": HISTORY}))),
            read_log(write(tmp_path / "metrics.csv", METRICS_CSV)),
            read_log(write(tmp_path / "log.jsonl", JSONL)),
            read_log(write(tmp_path / "train.log", MEGATRON))]
    for log in logs:
        assert isinstance(log, Log)
        assert all(len(values) == len(log.steps) for values in log.series.values())
        assert log.steps == sorted(log.steps)


def test_a_fifo_is_refused_at_once_not_read_forever(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "log.pipe"
    os.mkfifo(fifo)
    for fmt in (None, "text"):
        with pytest.raises(LogError, match="not a regular file or directory"):
            read_log(fifo, fmt)


def test_a_symlink_loop_says_so(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(LogError, match="too many levels of symbolic links"):
        read_log(loop)


def test_a_directory_under_a_file_format_names_the_format(tmp_path: Path) -> None:
    with pytest.raises(LogError, match="a directory; --format text reads a file"):
        read_log(tmp_path, "text")


def test_a_step_beyond_64_bits_is_one_clear_error(tmp_path: Path) -> None:
    path = write(tmp_path / "log.jsonl", "".join(
        f'{{"step": {2 ** 70 + i}, "loss": {2.0 - 0.01 * i}}}\n' for i in range(5)))
    with pytest.raises(LogError, match=r"step 1180591620717411303424 is beyond any training step"):
        read_log(path)


# -- many series names ----------------------------------------------------------------------------
NAMES, PER_ROW = 20_000, 8
"""A log of 20k names, 8 of them on each row beside the loss and the LR (per-parameter gradient
norms): 2500 rows, so a rows x names table would hold 50M cells (400 MB of pointers alone)."""


def sparse_rows() -> list[tuple[int, dict[str, float]]]:
    return [(row, {"loss": 2.0 * math.exp(-row / 1000) + 0.5, "lr": 1e-4,
                   **{f"grad_norm/p{j}": 1.0 + j % 5 / 10
                      for j in range(row * PER_ROW, (row + 1) * PER_ROW)}})
            for row in range(NAMES // PER_ROW)]


def many_jsonl(tmp_path: Path) -> Path:
    return write(tmp_path / "log.jsonl", "".join(json.dumps({"step": row, **record}) + "\n"
                                                 for row, record in sparse_rows()))


def many_hf(tmp_path: Path) -> Path:
    return trainer_state(tmp_path / "trainer_state.json",
                         [{"step": row, **record} for row, record in sparse_rows()])


def many_text(tmp_path: Path) -> Path:  # Megatron-LM lines: every `key: value` is read
    return write(tmp_path / "train.log", "".join(
        f" iteration {row + 1:8d}/ 100000 | " + " | ".join(
            f"{'lm loss' if k == 'loss' else k}: {v:.6E}" for k, v in record.items()) + " |\n"
        for row, record in sparse_rows()))


def many_tensorboard(tmp_path: Path) -> Path:
    return event_file(tmp_path / "events.out.tfevents.1.host", [
        (row, tag, value) for row, record in sparse_rows() for tag, value in record.items()])


def many_csv(tmp_path: Path) -> Path:
    """A Lightning metrics.csv of 20k columns, 40 lines each filling 500 of them."""
    rows, names = 40, [f"grad_norm/p{j}" for j in range(NAMES)]
    lines = [",".join(["step", "epoch", "train_loss_step", *names])]
    per_line = NAMES // rows
    for row in range(rows):
        fields = [""] * NAMES
        for j in range(row * per_line, (row + 1) * per_line):
            fields[j] = str(1.0 + j % 5 / 10)
        lines.append(",".join([str(row), "0", str(2.0 - row / 100), *fields]))
    return write(tmp_path / "metrics.csv", "\n".join(lines) + "\n")


@pytest.mark.parametrize("writer", [many_jsonl, many_hf, many_text, many_tensorboard, many_csv],
                         ids=["jsonl", "hf", "text", "tensorboard", "lightning"])
def test_many_series_names_cost_what_their_values_cost(writer: Callable[[Path], Path],
                                                      tmp_path: Path) -> None:
    path = writer(tmp_path)
    tracemalloc.start()
    try:
        log = read_log(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(log.series) >= NAMES and log.has("loss")
    # each name kept as its rows and values, not laid out over every row
    assert sum(not log.series.laid_out(name) for name in log.series) >= NAMES
    assert log.series.points("grad_norm/p123")[1] == [pytest.approx(1.3)]
    # linear in the file, with room to spare (a laid-out table of 2500 rows: 400 MB)
    assert peak < 64e6 + 30 * path.stat().st_size, f"{peak / 1e6:.0f} MB traced"
    result = analyze_log(log)
    assert result.rows == len(log) and result.verdict == "healthy"


def test_a_csv_whose_step_header_is_quoted_is_lightnings(tmp_path: Path) -> None:
    path = write(tmp_path / "metrics.csv", '"epoch","step","train_loss"\n0,0,1.5\n0,1,1.25\n')
    assert read_log(path).format == "lightning"


def test_a_csv_without_a_step_or_a_loss_column_is_a_clear_error(tmp_path: Path) -> None:
    path = write(tmp_path / "rewards.csv", "iteration,mean_reward\n" + "".join(
        f"{i},{10 + i}\n" for i in range(40)))
    with pytest.raises(LogError, match="no training log lines recognised"):
        read_log(path)
