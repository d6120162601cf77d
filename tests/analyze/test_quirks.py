"""What logged values mean (`trainguard.analyze.quirks.prepare`): HF's NaN-filtered logging
windows (`loss: 0.0` beside `grad_norm: NaN`), a frozen LR under an active schedule as skipped
fp16 steps, a falling loss scale, and a grad norm that is 0 throughout."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from trainguard.analyze import read_log
from trainguard.analyze.log import Log
from trainguard.analyze.quirks import amp_skips, frozen_lr, prepare

NAN = math.nan


def trainer_state(path: Path, rows: list[dict]) -> Path:
    history = [{"epoch": round(i / len(rows), 3), "step": 10 * (i + 1), **row}
               for i, row in enumerate(rows)]
    path.write_text(json.dumps({"log_history": history}, indent=2))
    return path


def read(tmp_path: Path, rows: list[dict]) -> Log:
    return read_log(trainer_state(tmp_path / "trainer_state.json", rows))


def nan_at(values: list[float | None]) -> list[int]:
    return [i for i, v in enumerate(values) if v is not None and math.isnan(v)]


# -- HF's logging_nan_inf_filter: loss 0.0 beside a NaN grad norm ----------------------------------
def test_a_zero_loss_beside_a_nan_grad_norm_reads_as_nan(tmp_path: Path) -> None:
    log = read(tmp_path, [
        {"loss": 2.5, "grad_norm": 1.0, "learning_rate": 1e-4},
        {"loss": 2.25, "grad_norm": 1.0, "learning_rate": 1e-4},
        {"loss": 0.0, "grad_norm": NAN, "learning_rate": 1e-4},
        {"loss": 0.0, "grad_norm": math.inf, "learning_rate": 1e-4},
        {"loss": 0.0, "grad_norm": 0.5, "learning_rate": 1e-4},  # a real 0.0, a finite norm
    ])
    assert log.series["loss"][2:] == [0.0, 0.0, 0.0], "the reader keeps what the file says"
    prepared = prepare(log)
    assert nan_at(prepared.series["loss"]) == [2, 3]
    assert prepared.series["loss"][:2] == [2.5, 2.25] and prepared.series["loss"][4] == 0.0
    assert nan_at(prepared.series["grad_norm"]) == [2]
    assert any("logging_nan_inf_filter" in note and note.startswith("2 row(s)")
               for note in prepared.notes)
    assert prepared.skipped is None, "a constant LR is no schedule: nothing is read as skipped"
    assert log.series["loss"][2] == 0.0 and log.notes == [], "prepare returns a copy"


def test_a_zero_loss_with_a_finite_grad_norm_stays_zero(tmp_path: Path) -> None:
    log = read(tmp_path, [{"loss": 0.5, "grad_norm": 0.25}, {"loss": 0.0, "grad_norm": 0.125},
                          {"loss": 0.0, "grad_norm": 0.0625}])
    prepared = prepare(log)
    assert prepared.series["loss"] == [0.5, 0.0, 0.0] and prepared.notes == []


def test_a_zero_after_a_jump_reads_as_nan_only_for_a_loss_that_stays_above_zero(
        tmp_path: Path) -> None:
    """Without a grad norm, a 0.0 right after a loss 100x its level is a filtered window; a
    policy-gradient surrogate, negative on some rows, is 0.0 wherever a group's rewards were
    all equal, and a jump of its magnitude says nothing of a window."""
    path = tmp_path / "log.txt"
    path.write_text("".join(f"step {i} loss={v}\n" for i, v in enumerate(
        [2.0, 1.9, 1.8, 1.7, 950.0, 0.0, 0.0, 1.6])))
    assert nan_at(prepare(read_log(path)).series["loss"]) == [5, 6]
    path.write_text("".join(f"[Step {i}/50] loss={v:.2f} reward_avg=0.5\n" for i, v in enumerate(
        [-0.32, -4.65, -5.85, -7.38, 3.05, -0.0, -0.0, -25.9, 55.0, -0.0, -0.0, 5.47])))
    prepared = prepare(read_log(path))
    assert nan_at(prepared.series["loss"]) == [] and prepared.notes == []


# -- a frozen LR under an active schedule: skipped optimizer steps --------------------------------
def schedule(n: int, peak: float = 1e-4) -> list[float]:
    """A cosine decay as a scheduler computes it: full-precision floats, a new one every step."""
    return [peak * 0.5 * (1 + math.cos(math.pi * i / 40)) for i in range(n)]


def test_a_decay_that_pauses_is_read_as_skipped_steps(tmp_path: Path) -> None:
    c = schedule(6)
    lrs = [c[0], c[1], c[2], c[3], c[3], c[3], c[4], c[5]]
    losses = [2.5, 2.4, 2.3, 2.25, 0.0, 2.2, 2.1, 2.0]  # 0.0 on a skipped step: a NaN window
    log = read(tmp_path, [{"loss": loss, "grad_norm": 1.0, "learning_rate": lr}
                          for loss, lr in zip(losses, lrs, strict=True)])
    assert log.skipped is None, "the reader itself marks nothing"
    prepared = prepare(log)
    assert prepared.skipped == [False, False, False, False, True, True, False, False]
    assert any(note.startswith("2 row(s) with the learning rate frozen") for note in prepared.notes)
    assert nan_at(prepared.series["loss"]) == [4], "loss 0.0 on a skipped step, finite norm"
    assert prepared.series["loss"][5] == 2.2


def test_a_warmup_from_zero_that_has_not_started_is_skipping(tmp_path: Path) -> None:
    lrs = [0.0, 0.0, 0.0, 1e-4 / 3, 2e-4 / 3, 1e-4]
    prepared = prepare(read(tmp_path, [{"loss": 2.0, "learning_rate": lr} for lr in lrs]))
    assert prepared.skipped == [True, True, True, False, False, False]


def test_a_decay_frozen_above_its_floor_to_the_end_is_skipping() -> None:
    c = schedule(4)
    assert frozen_lr([*c, c[3], c[3]]) == [False] * 4 + [True, True]


STEP_LR = [1e-3 / 3] * 10 + [1e-4 / 3] * 10 + [1e-5 / 3] * 10


@pytest.mark.parametrize("lrs", [
    [*schedule(30)[:26], *[schedule(30)[26]] * 4][:4] + [1e-7 / 3] * 3,  # reached its floor
    [2e-5 / 3] * 6,  # a constant LR: no schedule
    [1e-5 / 3, 2e-5 / 3, 1e-4 / 3, 1e-4 / 3, 1e-4 / 3],  # a warmup, then a constant LR
    [1e-3 / 3, 9e-4 / 3, 9e-4 / 3, 1e-3 / 3],  # down then up: not one schedule's direction
    [1e-3 / 3, 9e-4 / 3],  # too few rows to tell
    STEP_LR,  # StepLR: constant for a stretch, then a step; it never changes every step
    STEP_LR[:15],  # StepLR cut after its first step: frozen above any floor, yet no decay
    [*schedule(4), schedule(4)[3]] * 1 + [schedule(4)[3]],  # (a decay held at its end, rounded
], ids=["floor", "constant", "warmup-then-constant", "turns", "short", "steplr",
        "steplr-cut", "held"])
def test_an_lr_that_is_not_frozen_under_a_schedule(lrs: list[float]) -> None:
    if lrs and lrs[-1] == schedule(4)[3]:  # the held decay, as a logger that rounds writes it
        lrs = [float(f"{v:.4g}") for v in lrs]
    assert not any(frozen_lr(lrs))


def test_a_rounded_lr_is_not_read_for_frozen_rows() -> None:
    """A logger that writes the LR with 4 digits (`9.999e-05`) shows a cosine decay as stretches
    of equal values: they say nothing about skipped steps."""
    rounded = [float(f"{v:.4g}") for v in (1e-4 * (1 - i / 50000) for i in range(200))]
    assert any(a == b for a, b in itertools.pairwise(rounded))
    assert not any(frozen_lr(rounded))


def test_frozen_lr_skips_rows_without_an_lr() -> None:
    c = schedule(5)
    lrs: list[float | None] = [c[0], None, c[1], c[2], c[3], c[3], NAN, c[4]]
    assert frozen_lr(lrs) == [False, False, False, False, False, True, False, False]


def test_text_logs_round_the_lr_and_are_not_read_for_frozen_lrs(tmp_path: Path) -> None:
    lines = [f"step {s} | loss 2.0 | lr {lr}" for s, lr in
             [(1, "1.0e-04"), (2, "9.0e-05"), (3, "8.0e-05"), (4, "8.0e-05"), (5, "7.0e-05")]]
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    log = read_log(path)
    assert log.format == "text:generic" and prepare(log).skipped is None


def test_a_skipped_iterations_counter_marks_the_row_and_its_zero_loss(tmp_path: Path) -> None:
    """A log that says which steps were skipped (a Megatron counter): that row is skipped, and a
    0.0 loss there is a window of non-finite losses, whatever the grad norm."""
    path = tmp_path / "train.log"
    rows = [(10, "6.0E-05", 0), (20, "5.0E-05", 1), (30, "5.0E-05", 0), (40, "4.0E-05", 0)]
    path.write_text("".join(
        f" iteration {i}/ 100 | learning rate: {lr} | lm loss: 0.000000E+00 | grad norm: 1.0 | "
        f"number of skipped iterations: {skip} |\n" for i, lr, skip in rows))
    prepared = prepare(read_log(path))
    assert prepared.skipped == [False, True, False, False]
    assert nan_at(prepared.series["loss"]) == [1], "loss 0.0 on the skipped iteration only"


# -- the fp16 loss scale, and a grad norm that was never measured ---------------------------------
def test_a_falling_loss_scale_marks_overflow_skips(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    scales = [65536.0, 65536.0, 32768.0, 32768.0, 16384.0]
    path.write_text("".join(json.dumps({"step": s, "loss": 1.5, "loss_scale": scale}) + "\n"
                            for s, scale in enumerate(scales)))
    prepared = prepare(read_log(path))
    assert prepared.skipped == [False, False, True, False, True]
    assert any("loss scale fell" in note for note in prepared.notes)


def test_a_grad_norm_of_zero_on_every_row_is_left_out(tmp_path: Path) -> None:
    log = read(tmp_path, [{"loss": 2.0, "grad_norm": 0.0}, {"loss": 1.5, "grad_norm": 0.0},
                          {"loss": 1.0}])
    prepared = prepare(log)
    assert "grad_norm" in log.series and "grad_norm" not in prepared.series
    assert "the grad norm is 0 on every row: not measured, left out" in prepared.notes
    kept = prepare(read(tmp_path, [{"loss": 2.0, "grad_norm": 0.0},
                                   {"loss": 1.5, "grad_norm": 0.5}]))
    assert kept.series["grad_norm"] == [0.0, 0.5]


INF, NAN = math.inf, math.nan


@pytest.mark.parametrize("grads, skips", [
    # overflowed steps between finite norms (fp16 dynamic loss scaling), at the start too
    ([INF, NAN, 1.3, NAN, 1.2], [True, True, False, True, False]),
    # non-finite to the end: NaN weights, no skip
    ([1.3, 1.2, NAN, NAN, NAN], [False, False, False, False, False]),
    # the last row alone after a finite norm: a skip when the run showed it skips them
    ([1.3, NAN, 1.2, NAN], [False, True, False, True]),
    ([1.3, 1.2, NAN], [False, False, False]),
    # two rows non-finite to the end, after an earlier skip
    ([NAN, 1.3, NAN, NAN], [True, False, False, False]),
    # rows without a norm are passed over
    ([1.3, None, NAN, None, 1.2], [False, False, True, False, False]),
])
def test_without_a_loss_a_finite_norm_after_a_non_finite_one_says_it_was_skipped(
        grads: list[float | None], skips: list[bool]) -> None:
    assert amp_skips(None, grads, [False] * len(grads)) == skips
