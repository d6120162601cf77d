"""Tables of named columns pasted as text (`trainguard.analyze.header_table`): a header line of
names, then rows of numbers; each test written from the shape of a real log."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.analyze import analyze, read_log
from trainguard.analyze.log import LogError


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_a_chainer_print_report_is_read_under_its_header(tmp_path: Path) -> None:
    """Chainer's `PrintReport`: names and numbers aligned with runs of spaces; `validation/`
    columns are an evaluation's; the epoch column numbers the rows."""
    lines = ["$ python train_cifar.py -g 0", "# epoch: 300", "",
             "epoch       main/loss   validation/main/loss  main/accuracy  "
             "validation/main/accuracy  elapsed_time"]
    lines += [f"{e:<12d}{2.3 - 0.1 * e:<12.5f}{2.35 - 0.1 * e:<22.5f}{0.1 + 0.05 * e:<15.5f}"
              f"{0.1 + 0.04 * e:<26.5f}{61.0 * e:.3f}" for e in range(1, 9)]
    log = read_log(write(tmp_path / "log.txt", "\n".join(lines) + "\n"))
    assert log.format == "text:table" and log.step_unit == "epoch"
    assert log.steps == list(range(1, 9))
    assert log.values("loss")[0] == 2.2
    assert [step for step, _ in log.evals] == list(range(1, 9))
    assert "validation/main/loss" in log.evals[0][1]


def test_csv_lines_under_a_line_of_prose_are_a_table(tmp_path: Path) -> None:
    text = "Header of the train log:\nepoch,loss,ppl,accuracy\n" + "".join(
        f"{e}, {9.16 - 0.01 * e:.5f}, {9486 - 70 * e:.5f},{4.0 * e:.3f}\n" for e in range(10))
    result = analyze(write(tmp_path / "log.txt", text))
    assert result.format == "text:table" and result.verdict == "healthy"
    assert result.onset is None


def test_a_fastai_table_passes_over_its_time_column(tmp_path: Path) -> None:
    lines = ["epoch     train_loss  valid_loss  accuracy  time    "]
    lines += [f"{e:<10d}{2.3 - 0.1 * e:<12.6f}{2.4 - 0.1 * e:<12.6f}{0.5 + 0.02 * e:<10.6f}"
              f"00:{e + 5:02d}     " for e in range(8)]
    log = read_log(write(tmp_path / "fit.txt", "\n".join(lines) + "\n"))
    assert log.format == "text:table" and log.steps == list(range(8))
    assert log.values("loss")[0] == 2.3
    assert "time" not in log.series and [step for step, _ in log.evals] == list(range(8))


def test_a_nolearn_table_passes_over_its_duration_column(tmp_path: Path) -> None:
    """nolearn's epoch table: fields between bars, a `Dur` column of seconds with their unit."""
    lines = [" Epoch  |  Train loss  |  Valid loss  |  Train / Val  |  Valid acc  |  Dur",
             "--------|--------------|--------------|---------------|-------------|-------"]
    lines += [f"{e:>6}  |  {0.69 - 0.02 * e:>10.6f}  |  {0.70 - 0.02 * e:>10.6f}  |  "
              f"{0.98:>11.6f}  |  {50 + e:>9.2f}%  |  0.6s" for e in range(1, 9)]
    log = read_log(write(tmp_path / "fit.txt", "\n".join(lines) + "\n"))
    assert log.format == "text:table" and log.steps == list(range(1, 9))
    assert log.values("loss")[0] == pytest.approx(0.67)
    assert not any("dur" in name.lower() for name in log.series)


def _model_card(rows: list[tuple[str, float, int, str]]) -> str:
    """The 'Training results' table the HF Trainer writes into a model card, under its prose."""
    lines = ["---", "license: apache-2.0", "tags:", "- generated_from_trainer", "---", "",
             "It achieves the following results on the evaluation set:", "- Loss: 0.2505", "",
             "### Training results", "",
             "| Training Loss | Epoch | Step | Validation Loss | Wer    |",
             "|:-------------:|:-----:|:----:|:---------------:|:------:|"]
    lines += [f"| {loss:<13} | {epoch:<5} | {step:<4} | {val:<15} | 0.2    |"
              for loss, epoch, step, val in rows]
    return "\n".join(lines) + "\n"


def test_rows_that_end_in_an_elapsed_time_the_header_does_not_name(tmp_path: Path) -> None:
    """A GAN's table: `D_loss  acc  G_loss`, then rows split at bars that print a `timedelta`
    after the values (`2 days, 12:04:16.416641`): the values under their names, the time passed
    over."""
    lines = ["D_loss       acc     G_loss"]
    lines += [f"{0.004 + 0.0003 * (i % 3):.6f} | 100 | {5.0 + 0.2 * i:.6f} | 2 days, "
              f"12:0{i}:16.416641" for i in range(7)]
    log = read_log(write(tmp_path / "log.txt", "\n".join(lines) + "\n"))
    assert log.format == "text:table" and len(log.steps) == 7
    assert log.values("G_loss")[6] == pytest.approx(6.2)
    assert log.values("acc") == [100.0] * 7


def test_a_model_card_table_is_read_at_its_steps(tmp_path: Path) -> None:
    rows = [("No log", 0.32, 500, "2.9449"), ("2.9728", 0.64, 1000, "1.8492")]
    rows += [(f"{1.0 - 0.05 * i:.4f}", round(0.96 + 0.32 * i, 2), 1500 + 500 * i,
              f"{0.5 - 0.02 * i:.4f}") for i in range(10)]
    rows[5] = (f"**{rows[5][0]}**", rows[5][1], rows[5][2], rows[5][3])  # the best, in bold
    log = read_log(write(tmp_path / "README.md", _model_card(rows)))
    assert log.format == "text:table" and log.step_unit == "step"
    assert log.steps == [step for _, _, step, _ in rows], "Step numbers them, not Epoch"
    assert log.values("loss")[0] is None, "No log holds no value"
    assert log.values("loss")[5] == 0.85 and [s for s, _ in log.evals][:2] == [500, 1000]


def test_an_evaluation_loss_nan_to_the_end_breaks_the_run(tmp_path: Path) -> None:
    """The Trainer writes a training loss of 0.0 over a NaN window: the evaluations say it."""
    rows = [(f"{1.0 - 0.05 * i:.4f}", 0.3 * i, 500 * (i + 1), f"{0.5 - 0.02 * i:.4f}")
            for i in range(10)]
    rows += [("0.0", 3.0 + 0.3 * i, 5500 + 500 * i, "nan") for i in range(4)]
    result = analyze(write(tmp_path / "README.md", _model_card(rows)))
    assert (result.verdict, result.kind) == ("degraded", "nan")
    assert any("Validation Loss is nan from the evaluation at step 5500" in line
               for line in result.evidence)


def test_rows_without_a_counter_column_are_numbered(tmp_path: Path) -> None:
    text = "loss  accuracy\n" + "".join(f"{2 - 0.1 * i:.3f}  {0.5 + 0.02 * i:.3f}\n"
                                        for i in range(6))
    log = read_log(write(tmp_path / "log.txt", text))
    assert log.steps == list(range(1, 7)) and log.step_unit == "row"


def test_too_few_rows_or_no_loss_column_is_no_table(tmp_path: Path) -> None:
    short = "epoch  loss\n" + "".join(f"{e}  {2 - 0.1 * e:.3f}\n" for e in range(4))
    with pytest.raises(LogError, match="no training log lines recognised"):
        read_log(write(tmp_path / "short.txt", short))
    no_loss = "epoch  accuracy  lr\n" + "".join(f"{e}  {0.5 + e / 100:.3f}  0.1\n"
                                                for e in range(8))
    path = write(tmp_path / "no_loss.txt", no_loss + "epoch 9 loss: 1.0\n")
    assert read_log(path).format != "text:table"


def test_a_logger_prefix_and_columns_taking_turns(tmp_path: Path) -> None:
    """`... INFO [name] model._log_history : Step<TAB>Train loss<TAB>Valid loss`: the prefix is
    no field; training and validation rows each write `nan` in the other's column, placeholders
    not values. A `nan` where neither column holds a number is the NaN it is."""
    prefix = "2024-08-19 13:28:48,101 INFO [casanovo/MainProcess] model._log_history : "
    rows = [(20000, "nan", "1.594399"), (33440, "1.816622", "nan"), (40000, "nan", "1.010075"),
            (60000, "nan", "0.746913"), (66880, "0.945725", "nan"), (80000, "nan", "0.643513"),
            (100320, "0.712074", "nan"), (133760, "0.596518", "nan")]
    text = prefix + "Step\tTrain loss\tValid loss\t\n" + "".join(
        f"{prefix}{step}\t{train}\t{valid}\n" for step, train, valid in rows)
    result = analyze(write(tmp_path / "log.txt", text))
    assert result.format == "text:table" and result.verdict == "healthy", result.evidence
    broken = text + f"{prefix}140000\tnan\tnan\n{prefix}150000\tnan\tnan\n"
    result = analyze(write(tmp_path / "broken.txt", broken))
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "step 140000")


def _notebook_table(rows: list[tuple[int, str, str]]) -> str:
    """A notebook cell's saved HTML output: the HF Trainer's progress bar and its table, one
    tag per line, as `NotebookProgressCallback` writes them."""
    lines = ["<div>", "  <progress value='40' max='40' style='width:300px;'></progress>",
             "  [40/40 01:12, Epoch 8/8]", "</div>", '<table border="1" class="dataframe">',
             "  <thead>", ' <tr style="text-align: left;">', "      <th>Epoch</th>",
             "      <th>Training Loss</th>", "      <th>Validation Loss</th>", "    </tr>",
             "  </thead>", "  <tbody>"]
    for epoch, train, val in rows:
        lines += ["    <tr>", f"      <td>{epoch}</td>", f"      <td>{train}</td>",
                  f"      <td>{val}</td>", "    </tr>"]
    return "\n".join([*lines, "  </tbody>", "</table><p>"]) + "\n"


def test_a_notebooks_html_progress_table_is_read_as_a_table(tmp_path: Path) -> None:
    rows = [(1, "No log", "0.4284"), (2, "No log", "0.3950")]
    rows += [(e, f"{0.6 - 0.05 * e:.4f}", f"{0.45 - 0.01 * e:.4f}") for e in range(3, 9)]
    log = read_log(write(tmp_path / "cell_output.txt", _notebook_table(rows)))
    assert log.format == "text:table" and log.step_unit == "epoch"
    assert log.steps == list(range(3, 9)), "the rows of `No log` hold an evaluation only"
    assert log.values("loss")[0] == 0.45
    assert [step for step, _ in log.evals] == list(range(1, 9))
    result = analyze(write(tmp_path / "out.txt", _notebook_table(rows)))
    assert result.verdict == "healthy"


def test_a_dataframes_html_rows_on_one_line_each_are_read(tmp_path: Path) -> None:
    """A DataFrame's HTML: an unnamed index column, each row on one line, entities escaped; a
    loss going NaN is told from the epoch it did."""
    head = ("<table><thead><tr><th></th><th>epoch</th><th>loss</th><th>val&#95;loss</th>"
            "</tr></thead><tbody>")
    body = "".join(f"<tr><th>{i}</th><td>{i + 1}</td><td>{2.0 - 0.1 * i:.3f}</td>"
                   f"<td>{2.1 - 0.1 * i:.3f}</td></tr>\n" for i in range(8))
    body += "".join(f"<tr><th>{i}</th><td>{i + 1}</td><td>nan</td><td>nan</td></tr>\n"
                    for i in range(8, 11))
    result = analyze(write(tmp_path / "frame.html.txt", head + "\n" + body + "</tbody></table>"))
    assert (result.verdict, result.kind) == ("degraded", "nan")
    assert result.onset == "epoch 9"


def test_an_html_row_never_closed_is_no_row(tmp_path: Path) -> None:
    text = "<tr><td>epoch</td><td>loss</td>" + "x" * 30_000 + "\n" + "".join(
        f"<tr><td>{e}</td><td>{2 - 0.1 * e:.3f}</td></tr>\n" for e in range(3))
    with pytest.raises(LogError, match="no training log lines recognised"):
        read_log(write(tmp_path / "open.txt", text))


def test_a_timestamp_column_is_passed_over(tmp_path: Path) -> None:
    """An early Lightning CSV logger's `created_at` beside the loss and the epoch."""
    text = "train_loss,epoch,created_at\n" + "".join(
        f"{2.0 - 0.1 * e:.4f},{e},2020-02-03 16:{10 + e:02d}:44.934109\n" for e in range(8))
    log = read_log(write(tmp_path / "metrics.txt", text))
    assert log.format == "text:table" and log.steps == list(range(8))
    assert log.values("loss")[1] == 1.9 and "created_at" not in log.series


def test_a_phase_column_tells_evaluations_from_training_rows(tmp_path: Path) -> None:
    """fastai's miniai `MetricsCB`: columns `accuracy`, `loss`, `epoch`, `train`, a training row
    (`train`) then an evaluation row (`eval`) per epoch, in a notebook's saved HTML or as text;
    the evaluation rows are evaluations, not training rows that share the epoch."""
    rows = []
    for epoch in range(8):
        rows.append((f"{0.55 + 0.04 * epoch:.3f}", f"{1.20 * 0.8 ** epoch:.3f}", epoch, "train"))
        rows.append((f"{0.57 + 0.04 * epoch:.3f}", f"{1.10 * 0.8 ** epoch:.3f}", epoch, "eval"))
    html = ("<table border=\"1\" class=\"dataframe\">\n  <thead>\n    <tr>\n"
            + "".join(f"      <th>{name}</th>\n" for name in ("accuracy", "loss", "epoch", "train"))
            + "    </tr>\n  </thead>\n  <tbody>\n"
            + "".join("    <tr>\n" + "".join(f"      <td>{cell}</td>\n" for cell in row)
                      + "    </tr>\n" for row in rows) + "  </tbody>\n</table>\n")
    text = "accuracy  loss   epoch  train\n" + "".join(
        f"{a}     {b}  {e}      {p}\n" for a, b, e, p in rows)
    for name, content in (("cell_output.html.txt", html), ("printed.txt", text)):
        log = read_log(write(tmp_path / name, content))
        assert log.steps == list(range(8)) and log.step_unit == "epoch", name
        assert log.values("loss")[:2] == [1.2, 0.96], name
        assert [metrics["eval_loss"] for _, metrics in log.evals][:2] == [1.1, 0.88], name
        assert analyze(tmp_path / name).verdict == "healthy", name


def test_evaluation_rows_listed_after_all_training_rows_keep_their_own_epochs(
        tmp_path: Path) -> None:
    """`epoch loss split`, every `train` row first, then every `test` row (NaN from epoch 4):
    each evaluation at its own epoch, none merged into the last training row."""
    rows = [f"{e}  {1.2 * 0.8 ** e:.3f}  train" for e in range(8)]
    rows += [f"{e}  {'nan' if e >= 4 else f'{1.1 * 0.8 ** e:.3f}'}  test" for e in range(8)]
    log = read_log(write(tmp_path / "metrics.txt", "epoch  loss  split\n" + "\n".join(rows)))
    assert [step for step, _ in log.evals] == list(range(8))
    result = analyze(tmp_path / "metrics.txt")
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "epoch 4")
