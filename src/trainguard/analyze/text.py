"""Plain-text training logs: the line formats of common trainers, and a documented generic one.

Each grammar recognises the training lines (and evaluation lines) of one trainer wherever they
sit in a file (after timestamps, rank prefixes such as `[default7]:`, quote markers, inside a
markdown notebook); other lines are ignored. The grammar that recognises the most lines reads the
file; the generic grammar only reads files no trainer's grammar recognises. `nan`, `inf` and
`-inf` are read as such.

    megatron   Megatron-LM / Megatron-DeepSpeed:
               ` iteration   7010/ 159576 | ... | learning rate: 6.000E-05 | ... | lm loss:
               1.142026E+01 | loss scale: 2048.0 | grad norm: 219645.978 | ... | number of
               skipped iterations:   0 | number of nan iterations:   0 |`; every `key: value`
               between bars is read (`lm loss` -> loss, `grad norm`, `learning rate`, `loss
               scale`); `validation loss at iteration N | lm loss value: X` is an evaluation; a
               DeepSpeed `OVERFLOW! ... Skipping step` message marks the next iteration skipped, as
               does a non-zero skipped or NaN iteration counter.
    wlm        PyTorch examples/word_language_model:
               `| epoch   4 |  1400/ 2983 batches | lr 20.00 | ms/batch 11.96 | loss  5.94 | ppl
               379.47`, rows named `epoch 4, batch 1400` at the global batch (epoch - 1) x
               batches per epoch + batch; `| end of epoch 4 | ... | valid loss 6.33` is an
               evaluation at the epoch's end.
    nanogpt    nanoGPT train.py: `iter 3010: loss nan, time 1019.95ms, mfu 14.12%`; `step 3000:
               train loss 4.0390, val loss 4.0427` is an evaluation.
    mlx        mlx-lm (`mlx_lm.lora`): `Iter 10: Train loss 2.123, Learning Rate 1.000e-05,
               It/sec 1.234, ...`; `Iter 10: Val loss 2.345, Val took 1.2s` is an evaluation.
    llmc       llm.c's `main.log`: `s:120 trl:3.2811 lr:0.000600 norm:0.35` (the training
               loss, the LR and the gradient norm of step 120), `s:120 tel:3.30` (the validation
               loss) and `s:120 eval:0.2854` (HellaSwag's accuracy) are evaluations.
    rl         the console tables of OpenAI baselines and stable-baselines: the logger's
               `| approxkl | 0.0012 |` blocks between dashed rules, one row per update, and
               PPO1's `pol_surr | vf_loss | kl` table (`trainguard.analyze.rl_tables`).
    yolo       the Ultralytics YOLO / YOLOv5 training console (`trainguard.analyze.yolo`): a
               header `Epoch GPU_mem box_loss cls_loss dfl_loss Instances Size`, then the epoch's
               updates `1/100 2.61G 1.234 2.345 1.456 32 640: ...`; one row per epoch (its last
               update), the loss the sum of the terms.
    boosting   the consoles of CatBoost (`0: learn: 0.68 test: 0.69 best: 0.69 (0) total: ...`),
               XGBoost (`[0] train-rmse:17.1 eval-rmse:17.2`) and LightGBM (`[10] training's
               l2: 0.23 valid_1's l2: 0.25`) (`trainguard.analyze.boosting`): one row per
               iteration, the training set's loss metric the loss, the other sets evaluations.
    mllog      MLPerf's `:::MLLOG {"key": "tracked_stats", "value": {"train_loss": 2.1},
               "metadata": {"samples_count": 160, ...}}` lines (`trainguard.analyze.mllog`): rows
               by the samples counted, `eval_accuracy` an evaluation (a loss or an accuracy, as
               the benchmark defines it).
    deepxde    DeepXDE's `loss.dat` (`# step, loss_train, loss_test, metrics_test`, then rows of
               numbers; `trainguard.analyze.deepxde`): the loss the sum of the training terms,
               the test terms' sum an evaluation.
    history    Keras's `History.history` printed (`{'loss': [0.69, 0.52], 'val_loss': [0.71,
               0.60]}`), whole or cut off (`trainguard.analyze.history`): one row per epoch.
    generic    any other line holding a loss, as people write and paste them
               (`trainguard.analyze.pasted`): dict and JSON objects (the HF Trainer's console
               `{'loss': 0.0, 'grad_norm': nan, ...}`), `key=value` (tqdm postfixes), `key: value`
               (Keras, Python logging), `key value` pairs, printed loss tensors; the step from a
               counter the lines carry (`step`, `iter`, a progress counter, an epoch), else rows
               numbered from 1. For example `step 120 | loss 2.31 | lr 3e-4 | grad_norm 0.87` or
               `2024-05-01 12:00:00 global_step=120 loss=2.31 learning_rate=0.0003`.
    rvector    R's printed numeric vectors (`> log$train`, then `[1] 0.69 0.52 ...`: keras for
               R's `history$metrics`, mxnet's metric logger; `trainguard.analyze.r_vectors`):
               one row per epoch, `val_*` and `eval` vectors the evaluations.
    columns    a file of bare `counter value` lines (after a logger's prefix when the counter
               is named) and nothing else (`print(epoch, loss)`:
               `788 41.23225021362305`; or the counter of a total, `10000/ 200000: 2.1775`, as
               makemore prints it; or a CSV without its header, `201,4.3742,4.1354,7.63`; or
               the counter named, `batch: 383 0.6420 0.6281`, the rows then in its unit; or
               NumPy's `savetxt`, `1.000000000000000000e+03 5.13e+02 ...`): the first
               column, a whole number that only grows, numbers the rows, the second is the
               loss (with more columns after it, only when it is not whole numbers only, and
               said in a note). Read only when no other grammar recognises a line, and only
               when such lines are at least `COLUMNS_SHARE` of the file's non-blank lines and
               at least `COLUMNS_FEWEST` of them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from trainguard.analyze import (
    boosting,
    deepxde,
    header_table,
    history,
    mllog,
    pasted,
    r_vectors,
    rl_tables,
    yolo,
)
from trainguard.analyze.log import Log, LogBuilder, LogError, number
from trainguard.analyze.source import Lines, head

FORMAT = "text"
NUM = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf(?:inity)?)"

_MEGATRON = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|(.*)", re.IGNORECASE)
_MEGATRON_VALID = re.compile(r"validation loss at iteration\s+(\d+)[^|]*\|(.*)", re.IGNORECASE)
_OVERFLOW = pasted.OVERFLOW
_PAIR_COLON = re.compile(rf"^\s*([^:|]+?)\s*:\s*({NUM})\s*$", re.IGNORECASE)

_WLM = re.compile(rf"\|\s*epoch\s+(\d+)\s*\|\s*(\d+)\s*/\s*(\d+)\s+batches\s*\|\s*lr\s+({NUM})"
                  rf"\s*\|\s*ms/batch\s+{NUM}\s*\|\s*loss\s+({NUM})(?:\s*\|\s*ppl\s+({NUM}))?",
                  re.IGNORECASE)
_WLM_EPOCH = re.compile(rf"\|\s*end of epoch\s+(\d+)\s*\|.*?valid loss\s+({NUM})", re.IGNORECASE)

_NANOGPT = re.compile(rf"\biter\s+(\d+):\s*loss\s+({NUM})", re.IGNORECASE)
_NANOGPT_EVAL = re.compile(rf"\bstep\s+(\d+):\s*train loss\s+({NUM}),\s*val loss\s+({NUM})",
                           re.IGNORECASE)

_LLMC = re.compile(rf"^\s*s:(\d+)\s+(trl|tel|eval):({NUM})((?:\s+(?:lr|norm):{NUM})*)\s*$",
                   re.IGNORECASE)
_LLMC_PAIR = re.compile(rf"(lr|norm):({NUM})", re.IGNORECASE)
_LLMC_NAMES = {"lr": "lr", "norm": "grad_norm"}

_MLX = re.compile(rf"\bIter\s+(\d+):\s*Train loss\s+({NUM})(.*)")
_MLX_VAL = re.compile(rf"\bIter\s+(\d+):\s*Val loss\s+({NUM})")
_MLX_PAIR = re.compile(rf"^\s*([A-Za-z][A-Za-z/ ]*?)\s+({NUM})")



def _megatron(lines: Iterable[str], log: LogBuilder) -> int:
    found = 0
    pending_skip = False
    for line in lines:
        if _OVERFLOW.search(line):
            pending_skip = True
            continue
        valid = _MEGATRON_VALID.search(line)
        if valid:
            pairs = _bar_pairs(valid.group(2))
            log.add_eval(int(valid.group(1)), {f"validation {k.removesuffix(' value')}": v
                                               for k, v in pairs if not k.endswith("PPL")})
            continue
        match = _MEGATRON.search(line)
        if not match:
            continue
        found += 1
        pairs = _bar_pairs(match.group(2))
        counters = {k.lower(): v for k, v in pairs if k.lower().startswith("number of")}
        skipped = pending_skip or any(v > 0 for v in counters.values())
        pending_skip = False
        log.add_values(int(match.group(1)), [(k, v) for k, v in pairs
                                              if not k.lower().startswith("number of")],
                       label=f"iteration {int(match.group(1))}", skipped=skipped)
    return found


def _bar_pairs(text: str) -> list[tuple[str, float]]:
    out = []
    for field in text.split("|"):
        match = _PAIR_COLON.match(field)
        if match:
            value = number(match.group(2))
            if value is not None:
                out.append((match.group(1).strip(), value))
    return out


def _wlm(lines: Iterable[str], log: LogBuilder) -> int:
    found = 0
    batches = 0
    for line in lines:
        match = _WLM.search(line)
        if match:
            found += 1
            epoch, batch, batches = (int(match.group(i)) for i in (1, 2, 3))
            pairs = [("lr", match.group(4)), ("loss", match.group(5))]
            if match.group(6) is not None:
                pairs.append(("ppl", match.group(6)))
            log.add_values((epoch - 1) * batches + batch, pairs,
                           label=f"epoch {epoch}, batch {batch}")
            continue
        end = _WLM_EPOCH.search(line)
        if end and batches:
            value = number(end.group(2))
            if value is not None:
                log.add_eval(int(end.group(1)) * batches, {"valid loss": value})
    return found


def _nanogpt(lines: Iterable[str], log: LogBuilder) -> int:
    found = 0
    for line in lines:
        match = _NANOGPT.search(line)
        if match:
            found += 1
            log.add_values(int(match.group(1)), [("loss", match.group(2))])
            continue
        evaluation = _NANOGPT_EVAL.search(line)
        if evaluation:
            value = number(evaluation.group(3))
            if value is not None:
                log.add_eval(int(evaluation.group(1)), {"val loss": value})
    return found


def _llmc(lines: Iterable[str], log: LogBuilder) -> int:
    found = 0
    for line in lines:
        match = _LLMC.match(line)
        if match is None:
            continue
        step, kind, value = int(match.group(1)), match.group(2).lower(), number(match.group(3))
        if kind == "trl":
            found += 1
            pairs = [(_LLMC_NAMES[name.lower()], raw)
                     for name, raw in _LLMC_PAIR.findall(match.group(4))]
            log.add_values(step, [("loss", match.group(3)), *pairs])
        elif value is not None:  # the validation loss, or HellaSwag's accuracy
            log.add_eval(step, {"val loss" if kind == "tel" else "eval hellaswag acc": value})
    return found


def _mlx(lines: Iterable[str], log: LogBuilder) -> int:
    found = 0
    for line in lines:
        match = _MLX.search(line)
        if match:
            found += 1
            pairs = [("loss", match.group(2))]
            for part in match.group(3).split(","):
                pair = _MLX_PAIR.match(part)
                if pair:
                    pairs.append((pair.group(1).strip().lower(), pair.group(2)))
            log.add_values(int(match.group(1)), pairs)
            continue
        val = _MLX_VAL.search(line)
        if val:
            value = number(val.group(2))
            if value is not None:
                log.add_eval(int(val.group(1)), {"val loss": value})
    return found


def _generic(lines: Iterable[str], log: LogBuilder) -> int:
    return pasted.read_rows(lines, log)


_ONE_NUM = rf"(?:{pasted.DIGITS}|[-+]?(?:nan|inf(?:inity)?))"
"""`NUM` with one way to match a run of digits: a long number on a line fails in linear time."""
_COLUMNS = re.compile(rf"^\s*(?:(?:[^\n]*?[ \t,;])?(batch|step|iter|iteration|epoch)\s*[:,]?\s*)?"
                      rf"(\d+|\d\.\d+[eE][-+]?\d+)(?:\s*/\s*\d+\s*:\s*|[ \t,;]+)({_ONE_NUM})"
                      rf"((?:[ \t,;]+{_ONE_NUM})*)"
                      rf"\s*$", re.IGNORECASE)
"""`counter value...`, the counter alone or after its name (`batch: 383 0.64`, after whatever
a logger writes first: `INFO:run, 2022-03-11 11:44:36,164, epoch, 0138, 0.7617, 0.3218`)."""
COLUMNS_SHARE = 0.9
"""Bare two-number lines must make up this share of a file's non-blank lines: a file that says
nothing else about its numbers is read so only when the numbers are all it holds."""
COLUMNS_FEWEST = 5


def _columns(lines: Iterable[str], log: LogBuilder) -> int:
    filled = 0
    found = 0
    last: int | None = None
    ascending = True
    more, whole = False, True  # columns after the second; a second column of whole numbers
    named: list[str] = []  # the counter's name, where the lines write one (`batch: 383 ...`)
    for line in lines:
        if not line.strip():
            continue
        filled += 1
        match = _COLUMNS.match(line)
        if match is None:
            continue
        written = match.group(2)
        if written.isdigit():
            step = int(written)
        else:  # a whole number in exponent form (NumPy's `savetxt`: `1.000000000000000000e+03`)
            counter = float(written)
            if not counter.is_integer():
                continue
            step = int(counter)
        found += 1
        ascending = ascending and (last is None or step > last)
        last = step
        value = number(match.group(3))
        more = more or bool(match.group(4).strip())
        if match.group(1):
            named.append(match.group(1).lower())
        whole = whole and value is not None and math.isfinite(value) and value.is_integer()
        if ascending and value is not None:
            log.add(step, {"loss": value})
    if found < max(COLUMNS_FEWEST, COLUMNS_SHARE * filled) or not ascending:
        return 0  # too few such lines, or a first column that goes back: no counter
    if more and whole:
        return 0  # a second column of counts (a batch size, an epoch total) is no loss
    if named:
        log.step_unit = max(named, key=named.count)  # the first of the most used
    if more:
        log.notes.append("the lines name no column: the first is read as the step and the "
                         "second as the loss")
    return found


GRAMMARS: dict[str, tuple[Callable[[Iterable[str], LogBuilder], int], str]] = {
    "megatron": (_megatron, "iteration"),
    "wlm": (_wlm, "batch"),
    "nanogpt": (_nanogpt, "iter"),
    "mlx": (_mlx, "iter"),
    "llmc": (_llmc, "step"),
    "rl": (rl_tables.read_rows, "row"),
    "yolo": (yolo.read_rows, "epoch"),
    "boosting": (boosting.read_rows, "iteration"),
    "mllog": (mllog.read_rows, "samples_count"),
    "deepxde": (deepxde.read_rows, "step"),
    "table": (header_table.read_rows, "row"),
    "generic": (_generic, "step"),
    "history": (history.read_rows, "epoch"),
    "rvector": (r_vectors.read_rows, "epoch"),
    "columns": (_columns, "step"),
}
"""name -> (reader of the lines, the unit its steps count), in order of preference on a tie."""
MEANS = frozenset({"megatron", "wlm", "mlx"})
"""Grammars of trainers whose logged loss is the mean of the steps since the last line
(Megatron's `lm loss`, word_language_model's `cur_loss`, mlx-lm's train loss): one such row is
a level, where one row of single-batch losses (nanoGPT's `iter N: loss X`) is not."""


def read_lines(path: Path) -> Lines:
    """The file's lines, read one at a time each time they are iterated over."""
    if b"\0" in head(path):
        raise LogError(f"{path}: a binary file, not a text log (and no other format reads it)")
    return Lines(path)


def read(path: str | Path, grammar: str | None = None) -> Log:
    path = Path(path)
    lines = read_lines(path)
    best: tuple[int, LogBuilder] | None = None
    for name in ([grammar] if grammar else list(GRAMMARS)):
        if (name in ("generic", "columns") and best is not None
                and not best[1].rows_are_evaluations):  # a trainer's own lines first
            break  # (a printed history competes with the generic lines on rows read; the
            # training lines of a file whose trainer's grammar found evaluations only, an
            # MLPerf result whose benchmark prints its own losses, compete with them too)
        parse, unit = GRAMMARS[name]
        log = LogBuilder(path, f"{FORMAT}:{name}", step_unit=unit)
        found = parse(lines, log)
        if found and (best is None or found > best[0]):
            best = (found, log)
    if best is None:
        names = ", ".join(GRAMMARS) if grammar is None else grammar
        looked = ("a loss on a line: `loss: 0.53`, `loss=0.53`, `{'loss': 0.53, ...}`, "
                  "`train loss 0.53`, `tensor(0.53)`, a perplexity; a file of bare "
                  "`step loss` lines; and the lines of " if
                  grammar in (None, "generic") else "")
        left = f"; {note}" if (note := lines.note()) is not None else ""
        raise LogError(f"{path}: no training log lines recognised (looked for {looked}{names}: "
                       f"see `trainguard analyze --help` for the line formats){left}")
    if (note := lines.note()) is not None:
        best[1].notes.append(note)
    return best[1].build()


def sniff(lines: Iterator[str] | list[str]) -> bool:
    """Whether any grammar recognises a training line among `lines`."""
    sample = list(lines)
    return any(GRAMMARS[name][0](sample, LogBuilder("", name)) for name in GRAMMARS)
