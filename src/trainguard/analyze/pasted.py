"""Training values on a line, as people write and paste them: the tolerant text grammar.

A line holds a training row when it holds a loss-like value (a name with `loss` in it that is not
an evaluation's, or a printed loss tensor). Values are found by what the line holds, wherever they
sit after timestamps, logger prefixes, quote markers and progress bars:

    {'loss': 0.0, 'grad_norm': nan, 'learning_rate': 2e-05, 'epoch': 0.01}   a dict or JSON object
                                                     (HF Trainer console, TRL, LLaMA-Factory)
    steps: 1%| | 41/3280 [00:50<1:06:54, 1.24s/it, avr_loss=nan]   `key=value` (tqdm postfixes)
    9595/9595 [====] - 1s - loss: nan - acc: 0.41 - val_loss: nan   `key: value` (Keras, logging)
    INFO:tensorflow:global step 438: loss = 5.4e+19 (0.403 sec/step)
    2018-03-23 15:40:22,720:INFO: train loss:nan        names of up to three words before `:`/`=`
    step 3866, loss 0.43315, acc 0.90625                `key value`, one word
    tensor(nan, device='cuda:0', grad_fn=<NllLossBackward0>)     a printed tensor: the loss

`nan`, `NaN`, `inf`, `-inf`, `Infinity` are read as such. A value followed by a unit (`1.2s`,
`15%`, `562ms`) is not a value.

**The step.** Among the counters the rows hold (`global_step`, `step`, `iteration`, `iter`, `it`,
a progress counter `41/3280 [`, an `epoch` on the line or on an `Epoch 2/10` line before it),
the one that numbers the most rows distinctly and never goes back numbers them, in its own unit;
a counter that repeats (`Epoch 1` on every line of the epoch, a float epoch) does not. Without
one, rows are numbered from 1 (`row 3`), with the epoch in their name where the line has one.
Records printed on one line, or wrapped over several at a width (`Epoch #1 Loss: 0.55
Accuracy: 0.72 Epoch #2 Loss:` then `0.43 ...`), are cut at their counter, one row each.
Lines without the step belong to the step of the line before them; at the head of a paste
that starts inside a record, to the step of the line that closes it (Caffe's `Iteration N, lr`).
A line that gives a step and nothing else of the run numbers the next row without one (NeMo's
`Step: 2100`, then `Loss: 100.46`). An object printed over several lines (pprint's dict) is one
line's.
The same row printed twice (a line logged by two handlers, one rounding: LLaMA-Factory's
callback beside the Trainer's) is read once. A run's closing totals (`train_runtime`, ...)
are not a row.
"""

from __future__ import annotations

import ast
import itertools
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from trainguard.analyze.log import (
    EVAL_PREFIXES,
    GRAD_NORM,
    LOSS_WORDS,
    MAX_STEP,
    LogBuilder,
    LogError,
    canonical_name,
    is_eval_name,
    is_train_loss,
    number,
)
from trainguard.analyze.rl_log import is_reward_name

NUM = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf(?:inity)?)"
_END = r"(?![\w%/]|\.\S)"
"""A value ends where no unit (`s`, `ms`, `%`, `/it`) or further digit follows; a full stop
ends it too when the text goes on after a space (`Mean training loss: 0.0435.  Mean ...`),
not when more follows it at once (a version `1.2.3`)."""
_WORD = r"[A-Za-z_][\w./-]*"

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
OVERFLOW = re.compile(r"OVERFLOW!.*skipping step|gradient overflow\.?\s+skipping step",
                      re.IGNORECASE)
"""A loss scaler's message that the step was skipped (DeepSpeed's `OVERFLOW! Rank 0 Skipping
step. Attempted loss scale: ...`, apex's `Gradient overflow.  Skipping step, loss scaler 0
reducing loss scale to ...`): it marks the next training row skipped."""
_BRACKETED_NAME = re.compile(
    r"\[(?!(?:info|warn(?:ing)?|error|debug|critical|rank\d*|default\d*)\])"
    r"([A-Za-z_][\w./-]{0,40})\]\s*:(?=\s*[-+]?(?:\d|nan|inf)[\w.+-]*(?:[,;\s]|$))",
    re.IGNORECASE)
"""A name in brackets before its value (`[epoch]: 199, [loss]: 4.99`): the name, unbracketed
(`[train]:  48%|` is a progress bar's prefix, no value; a log level or a launcher's rank,
`[INFO]:`, `[rank0]:`, is no name)."""
_HEADING = re.compile(r"^ {0,3}#{2,6}[ \t][^0-9]*$")
"""A Markdown heading without a digit (`### loss NAN` over a pasted log in a README): a title,
never a logged row (one `#` is left alone: a comment line a logger writes; a heading with a
number, `### Epoch 1/10 - loss: 1.900`, may be a trainer's line)."""
_EMPHASIS = re.compile(r"\*\*|__|`|\\(?=[*_])")
"""Markdown around a pasted value (`loss = **0.0002**`, `\\*`): not part of it."""
_TENSOR = re.compile(rf"tensor\(\s*\[?\s*({NUM})\s*\]?\s*(?:,[^()]*(?:\([^()]*\)[^()]*)*)?\)",
                     re.IGNORECASE)
_BARE_TENSOR = re.compile(rf"^\W*tensor\(\s*\[?\s*({NUM})[^\n]*\)\W*$", re.IGNORECASE)
_THOUSANDS = r"\d{1,3}(?:,\d{3})+(?![\d.])"
"""A whole number written with thousands separators (BasicSR's `iter:   1,000`)."""
_SEPARATED = re.compile(rf"(?<![\w./-])((?:{_WORD}[ \t]){{0,2}}{_WORD})\s*[:=]\s*"
                        rf"(?:\[\s*(?={NUM}\s*\]))?({_THOUSANDS}|{NUM})(?:\s*\])?{_END}",
                        re.IGNORECASE)
"""`name: value` and `name=value`; a value alone in brackets too (`Loss:[0.0830]`, a list of
one printed as is), a whole number with thousands separators (`iter: 1,000`)."""
_SPACED = re.compile(rf"(?<![\w./-])({_WORD})[ \t]+({NUM}){_END}", re.IGNORECASE)
_IS = re.compile(rf"(?<![\w./-])((?:{_WORD}[ \t]){{0,2}}{_WORD})[ \t]+(?:is|was)[ \t]+"
                 rf"(?:=+>[ \t]*)?({NUM})(?=[\s.,;)]|$)", re.IGNORECASE)
"""`Loss is NaN.`, `Current learning rate is 0.08` (a sentence, as BigDL and others print),
`Avg Reward is ==> -1020.8` (with an arrow)."""
DIGITS = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
r"""A number written in digits, with one way to match each run of them (`NUM`'s `\d+\.?\d*`
splits a long run in as many ways as it has digits: a line of 20k digits took seconds)."""
_TRAILING_LOSS = re.compile(rf"(?<![\w./:=$€£¥-])({DIGITS})[ \t]+(loss|cost)"
                            rf"(?=[ \t]*(?:[,;|\])]|$))", re.IGNORECASE)
"""`0.419 cost,` (Neon's progress bar: `[Train |####|  118/118  batches, 0.419 cost, 0.93s]`), `2.31
loss |`: a value in digits before the loss's own name, at the end of its field (read when nothing
on the line names a value `loss` or `cost` the usual way round; not a price, `$0.004 cost`, nor
prose, `skipping a batch with nan loss`)."""
_LABELLED = re.compile(rf"(?<![\w./-])((?:[A-Za-z_]+[ \t]){{0,2}}[A-Za-z_]+)[ \t]+(\d+)[ \t]*:"
                       rf"[ \t]+({NUM}){_END}(?!:)", re.IGNORECASE)
"""`Validation loss 6312:  0.149928`, `Average loss at step 2000 : 4.39`: a name in letters
numbered by its step, a colon (spaced or not), a space, then its value (the step is not the
name's value, as `key value` would read it; a time such as `01:17:15` has no space after its
colons)."""
_LABELLED_LOSS = re.compile(rf"(?<![\w./-])((?:[A-Za-z_]+[ \t]){{0,2}}[A-Za-z_]*loss)[ \t]+(\d+)"
                            rf"[ \t]+([-+]?\d*\.\d+(?:[eE][-+]?\d+)?|nan|inf){_END}(?!:)",
                            re.IGNORECASE)
"""`Train loss 64998 0.302735` (NVIDIA's Tacotron 2 and WaveGlow): a loss numbered by its step
with no colon between, told from `loss 2` by the whole number followed by one with a decimal
point."""
_PROGRESS = re.compile(r"(?<![\w./])(\d+)\s*/\s*(\d+)\s*\[|\[\s*(\d+)\s*/\s*(\d+)\s*\]")
_OF_TOTAL = re.compile(r"(?<![\w./-])(epoch|steps?|iter|iteration|it|batch)\s*[:=]?\s*\[?\s*(\d+)"
                       r"\s*/\s*(\d+)\s*\]?", re.IGNORECASE)
_BRACKET_WORD = re.compile(r"(?<![\w./-])(epoch|step|iter|iteration|batch)"
                           r"(?:\((?:train|training)\))?\s*:?\s*\[\s*(\d+)\s*\]", re.IGNORECASE)
"""`Epoch [3]`, and MMEngine's `Epoch(train) [3][ 50/500]` (the epoch, then its progress)."""
_TRAIN_EPOCH = re.compile(r"(?<![\w./-])(?:train|training)(\s+epoch)?\s*:\s*(\d+)\s*\[\s*(\d+)\s*/"
                          r"\s*(\d+)", re.IGNORECASE)
"""timm's `Train: 3 [ 100/1251 (  8%)]`: the epoch, then its progress in batches; PyTorch's
MNIST example's `Train Epoch: 3 [6400/60000 (11%)]`: the epoch, then its progress in samples
(`batch_idx * len(data)` of the dataset's length)."""
_HASH_WORD = re.compile(r"(?<![\w./-])(epoch|step|iter|iteration|batch)\s*#\s*(\d+)(?!\w)",
                        re.IGNORECASE)
"""`Epoch #3`: a counter numbered with `#`."""
_LEADING_OF_TOTAL = re.compile(
    r"\s*(\d+)\s*/\s*(\d+)(?=\s)(?!\s*[\u2500-\u259f|#=>\[-])(?!\s+\d{1,2}:\d{2})")
"""A bare `1920/191900 (epoch 1) loss: ...` at the head of a line: the step, of the steps the
run plans (a progress bar's `41/3280 [` and a bracketed `[41/3280]` are `_PROGRESS`'s; Keras
3's `25/25 ━━━━` and Keras 2's `1875/1875 - 3s - loss: ...` are a bar's progress within the
epoch, not a step: no bar or dash may follow, nor a time, as after a date's `05/12`)."""
_COUNTER_AT = re.compile(r"(?<![\w./-])(epoch|step|iter|iteration|batch)\s*[#:=]?\s*(\d+)(?![\w.])",
                         re.IGNORECASE)
"""Where a record starts on a line: a counter and its whole number."""
_NAMED_STEP = re.compile(r"(?<![\w./-])(step|iter|iteration|it|batch|global_step|num_updates)"
                         r"\s*[#:=]?\s*\d", re.IGNORECASE)
"""A step-like counter named on the line (an epoch is no step)."""
_EPOCH_HEADER = re.compile(r"^\W*epoch\s*[:=]?\s*\[?\s*(\d+)\s*(?:/\s*\d+)?\s*\]?\W*$",
                           re.IGNORECASE)
_QUOTED_NAME = re.compile(rf"([\"'])({_WORD})\1(?=\s*[:=])")
"""A quoted name before its value outside a whole object (`"grad_norm": 1.31,`: the lines of a
pretty-printed JSON record, cut from it): the name without its quotes."""
_NONFINITE_WORD = re.compile(r"(?<![\w'\"])(-?(?:nan|inf(?:inity)?))(?![\w'\"])", re.IGNORECASE)

_EVAL_WORDS = r"(?:valid|validation|eval|evaluation|dev|test|cv)"
"""The words a logger names an evaluation's phase by (`cv`: cross-validation)."""
_EVAL_FIELD = re.compile(rf"(?:\|\s*{_EVAL_WORDS}\s*\|)|(?:\[\s*{_EVAL_WORDS}\s*\])",
                         re.IGNORECASE)
"""A field that says the line reports an evaluation: one of a `|`-separated logger line
(fairseq's `| valid |`) or a bracketed tag (Marian's `[valid]`)."""
_EVAL_HEAD = re.compile(rf"(?<![\w./-]){_EVAL_WORDS}\s*:\s*\[\s*\d", re.IGNORECASE)
"""An evaluation's line headed by its phase and its progress: timm's `Test: [  10/49]` beside
its `Train: 3 [ 100/1251 (  8%)]`."""
_EVAL_SET = re.compile(rf"^\W*(?:val|{_EVAL_WORDS})\s+set\s*:", re.IGNORECASE)
"""An evaluation's line headed by the set it scores: PyTorch's MNIST example prints `Test set:
Average loss: 0.0284, Accuracy: 9910/10000 (99%)` after each epoch's `Train Epoch:` lines."""
_EVAL_PHASE = re.compile(rf"(?<![\w./-])(?:val|{_EVAL_WORDS})"
                         r"[ \t]+(?=(?:batch|epoch|step|iter|iteration)\b)", re.IGNORECASE)
"""An evaluation's phase word before the line's counter: WeNet's and ESPnet's `TRAIN Batch
4/203700 loss ...` beside `CV Batch 4/0 loss ...` (cross-validation), `Val epoch 0 has acc
0.249 and loss 1.386`."""

COUNTERS = ("global_step", "global step", "step", "steps", "iteration", "iterations", "iter",
            "iters", "it", "num_updates", "updates", "update",
            "current_steps", "progress", "batch", "epoch", "episode")
"""Names that number rows."""
FAMILY = {"global_step": "step", "global step": "step", "steps": "step", "current_steps": "step",
          "iteration": "step", "iterations": "step", "iter": "step", "iters": "step",
          "it": "step", "num_updates": "step", "updates": "step", "update": "step",
          "episode": "step"}
"""Spellings of one counter (`global_step=120` on one line, `step: 130` on the next; the first
on a line counts: litgpt's `iter 1152 step 144` counts iterations)."""
ABBREVIATED = {"ep.": "epoch", "up.": "update", "it.": "it", "iter.": "iter"}
"""Counters written short with a dot (Marian's `Ep. 2 : Up. 80000`)."""
NUMBERING = ("step", "progress", "batch", "epoch")
"""The counters in order of preference (a tie in how well they number goes to the earlier)."""
TOTALS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second"})
"""Keys of the closing summary a trainer prints once (not a training row)."""
SPELLING = "_spelling"
TOTAL = "_total"
WITHIN = "_within"
"""How the line names a progress counter that restarts each epoch, where it says (`sample`)."""
"""The total of a progress counter (`41/3280`): where it restarts each epoch, rows are numbered
across epochs as (epoch - first epoch) x total + progress."""
ROUNDING = 1e-3
"""Two printings of one row agree to within this relative difference (one of them rounded)."""


@dataclass(slots=True)
class LineRow:
    values: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    epoch: float | None = None
    spelling: str = "step"
    """How the line names its step counter (`iter`, `global step`...)."""
    total: float | None = None
    """The total of the line's progress counter (`41/3280` -> 3280)."""
    within: str = ""
    """How the line names a counter that restarts each epoch (`batch`, `iter`); empty for a
    progress bar (`41/3280 [`)."""
    skipped: bool = False
    """A loss scaler's overflow message came before the line (`OVERFLOW! ... Skipping step`):
    the optimizer skipped this step."""


_GAN_VISUALIZER = re.compile(r"\(epoch: \d+, iters: \d+, time: [\d.]+(?:, data: [\d.]+)?\)")
"""The head of a line of pytorch-CycleGAN-and-pix2pix's visualizer (and its many forks; the
releases before 2018 print no `data:` time): the values after it are the model's losses, each
under its own short name (`G_GAN`, `G_L1`, `D_real`, `D_fake`; `D_A`, `G_A`, `cycle_A`,
`idt_A`)."""


def _labelled(text: str) -> Iterator[re.Match[str]]:
    """The labelled values of `text`: `Validation loss 6312:  0.149928`, then
    `Train loss 64998 0.302735`."""
    return itertools.chain(_LABELLED.finditer(text), _LABELLED_LOSS.finditer(text))


def parse_line(line: str) -> tuple[dict[str, float], dict[str, float]]:
    """(named values, counters) found on one line; the step counter's own spelling is kept
    under `SPELLING`."""
    text = _BRACKETED_NAME.sub(r"\1:", _ANSI.sub("", line))
    head = _GAN_VISUALIZER.search(text)
    if head:  # what follows the head is losses: named as such (`loss_D_real`)
        losses, after = parse_line(text[head.end():])
        _, numbered = parse_line(head.group(0)[1:-1])  # the head without its parentheses
        return {f"loss_{name}": value for name, value in losses.items()}, numbered | after
    values: dict[str, float] = {}
    counters: dict[str, float] = {}
    spellings: dict[str, Any] = {}
    bare = _BARE_TENSOR.match(text)
    if bare:
        value = number(bare.group(1))
        if value is not None:
            values["loss"] = value
        return values, counters
    text = _TENSOR.sub(lambda m: m.group(1), text)
    text = _EMPHASIS.sub("", text)
    rest = []
    for chunk, is_object in _objects(text):
        if not is_object:
            rest.append(chunk)
            continue
        record = _object(chunk)
        if record is None:
            rest.append(chunk)
            continue
        for name, raw in record.items():
            value = raw if isinstance(raw, float) else number(raw)
            if value is not None:
                values[str(name).strip()] = value
    remaining = _QUOTED_NAME.sub(r"\2", " ".join(rest))
    remaining = _train_epoch(remaining, counters, spellings)
    for pattern in (_OF_TOTAL, _BRACKET_WORD, _HASH_WORD):
        for match in pattern.finditer(remaining):
            _count(counters, spellings, match.group(1).lower(), float(match.group(2)))
        remaining = pattern.sub(" ", remaining)
    progress = _PROGRESS.search(remaining)
    if progress:
        done, total = (progress.group(1), progress.group(2)) if progress.group(1) else (
            progress.group(3), progress.group(4))
        counters["progress"] = float(done)
        counters[TOTAL] = float(total)
        remaining = remaining[:progress.start()] + " " + remaining[progress.end():]
    else:
        remaining = _leading_step(remaining, counters, spellings)
    for match in _labelled(remaining):
        words, counted = _named_counter(match.group(1))
        name = _name(words)
        value = number(match.group(3))
        if not name or name.lower() in COUNTERS or value is None:
            continue
        values.setdefault(name, value)
        _count(counters, spellings, counted, float(match.group(2)))
        remaining = remaining.replace(match.group(0), " ", 1)
    taken: list[tuple[int, int]] = []
    found = [(match, number(match.group(2).replace(",", "")))
             for match in (*_SEPARATED.finditer(remaining), *_IS.finditer(remaining))]
    short = [_name(match.group(1)) for match, _ in found]
    for (match, value), name in zip(found, short, strict=True):
        if name and value is not None:
            if short.count(name) > 1:  # `ARM_L Loss: 3.0 ODM_L Loss: nan`: distinct terms
                name = _qualified(match.group(1), name)
            values.setdefault(name, value)
            taken.append(match.span())
    for match in _SPACED.finditer(remaining):
        if any(a <= match.start() < b for a, b in taken):
            continue
        value = number(match.group(2))
        if value is not None:
            values.setdefault(match.group(1), value)
    _trailing_loss(remaining, values)
    for name in list(values):
        lowered = _counter_name(ABBREVIATED.get(name.lower(), name.lower()), values[name])
        if lowered in COUNTERS:
            _count(counters, spellings, lowered, values.pop(name))
    return values, counters | spellings


def _trailing_loss(text: str, values: dict[str, float]) -> None:
    """`0.419 cost` (`_TRAILING_LOSS`) added to `values`, when none of them is named `loss` or
    `cost` the usual way round."""
    if any(name.lower() in ("loss", "cost") for name in values):
        return
    for match in _TRAILING_LOSS.finditer(text):
        value = number(match.group(1))
        if value is not None:
            values.setdefault(match.group(2).lower(), value)


def _train_epoch(text: str, counters: dict[str, float], spellings: dict[str, Any]) -> str:
    """The epoch and its progress of a `Train: 3 [ 100/1251` head (timm's, in batches) or a
    `Train Epoch: 3 [6400/60000` one (PyTorch's MNIST example's, in samples) into `counters`;
    the text without it."""
    head = _TRAIN_EPOCH.search(text)
    if head is None:
        return text
    counters["epoch"], counters["progress"], counters[TOTAL] = (
        float(head.group(2)), float(head.group(3)), float(head.group(4)))
    if head.group(1):
        spellings[WITHIN] = "sample"
    return text[:head.start()] + " " + text[head.end():]


def _leading_step(remaining: str, counters: dict[str, float], spellings: dict[str, Any]) -> str:
    """A bare step of its total at the head of the line (`_LEADING_OF_TOTAL`) counted as the
    step, when the line names no step of its own (`0/8 step 100`: the step is 100) and the
    step is within its total (a date's `12/05` is not); the rest of the line."""
    leading = _LEADING_OF_TOTAL.match(remaining)
    if (leading is None or int(leading.group(1)) > int(leading.group(2))
            or "step" in counters or _NAMED_STEP.search(remaining, leading.end())):
        return remaining
    _count(counters, spellings, "step", float(leading.group(1)))
    return remaining[leading.end():]


def _count(counters: dict[str, float], spellings: dict[str, Any], name: str,
           value: float) -> None:
    """A line's counter `name` (a spelling of its family: `iteration` counts steps) at `value`;
    the first counter of a family on the line counts, and the step's keeps its spelling."""
    family = FAMILY.get(name, name)
    if family == "step" and "step" not in counters:
        spellings[SPELLING] = name
    counters.setdefault(family, value)


CONNECTIVES = frozenset({"after", "at", "in", "of", "for", "on"})
"""Words between a value's name and the counter that numbers it (`Cost after iteration 100:`)."""


def _named_counter(words: str) -> tuple[str, str]:
    """The name of a labelled value and the counter its number is: `Cost after iteration`
    names the cost at an iteration (`("Cost", "iteration")`); a name without a counter word
    at its end is numbered by its step (`Validation loss 6312:`)."""
    parts = words.split()
    if len(parts) >= 2 and parts[-1].lower() in COUNTERS:
        counted = parts.pop().lower()
        if len(parts) >= 2 and parts[-1].lower() in CONNECTIVES:
            parts.pop()
        return " ".join(parts), counted
    return words, "step"


def _counter_name(name: str, value: float) -> str:
    """A counter named with a word before it (`train iter: 194`, `training step 20`) by the
    counter's own name; any other name as it is. An evaluation's counter (`valid step`) and a
    value that is no whole number stay values."""
    words = name.split()
    if (len(words) > 1 and words[-1] in COUNTERS and float(value).is_integer()
            and not any(f"{words[0]} ".startswith(p) for p in EVAL_PREFIXES if p.endswith(" "))):
        return words[-1]
    return name


def _unprefixed(name: str) -> str:
    """An evaluation's name without its evaluation prefix (`eval_cross-entropy` ->
    `cross-entropy`)."""
    lowered = name.lower()
    prefix = next((p for p in EVAL_PREFIXES if lowered.startswith(p)), "")
    return name[len(prefix):]


def _name(words: str) -> str:
    """A name of several words loses the leading ones that are not part of it (`INFO train
    loss` -> `train loss`): kept are the last word and the words before it that are letters."""
    parts = words.split()
    kept = [parts[-1]]
    for part in reversed(parts[:-1]):
        if not part.isalpha() or (part.isupper() and len(part) > 1):
            break
        kept.insert(0, part)
    for start in range(len(kept) - 1):  # `Current learning rate` -> `learning rate`
        tail = " ".join(kept[start:])
        if canonical_name(tail) != tail:
            return tail
    return " ".join(kept)


def _qualified(words: str, name: str) -> str:
    """The name of a value whose short name another value on its line shares: with the word
    before it that tells them apart (`ARM_L Loss` beside `ODM_L Loss`, both `Loss` once a
    logger prefix's way of dropping what is not letters has run)."""
    parts = words.split()
    size = len(name.split())
    if len(parts) > size and not parts[-size - 1].isdigit():
        return " ".join(parts[-size - 1:])
    return name


def _objects(text: str) -> Iterable[tuple[str, bool]]:
    """The line cut into `{...}` objects (balanced braces) and the text between them."""
    depth, start, last = 0, 0, 0
    for i, char in enumerate(text):
        if char == "{":
            if depth == 0:
                start = i
            depth += 1
        elif char == "}" and depth:
            depth -= 1
            if depth == 0:
                yield text[last:start], False
                yield text[start:i + 1], True
                last = i + 1
    yield text[last:], False


def _object(chunk: str) -> dict[str, Any] | None:
    try:
        record = json.loads(chunk)
    except ValueError:
        try:
            record = ast.literal_eval(_NONFINITE_WORD.sub(r"'\1'", chunk))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    if not isinstance(record, dict):
        return None
    return {str(k): v for k, v in record.items()
            if isinstance(v, (int, float, str)) and not isinstance(v, bool)}


PERPLEXITY = frozenset({"ppl", "perplexity", "train_ppl", "train perplexity", "train_perplexity"})


def is_loss_name(name: str) -> bool:
    """A training loss by its name (`trainguard.analyze.log.is_train_loss`), never an
    evaluation's."""
    return name == "loss" or is_train_loss(name)


_ACCURACY = ("_acc", "_accuracy", " acc", " accuracy")
"""How a term's own accuracy is named after the term (`polyphone_loss`, `polyphone_acc`)."""


def _without_empty_terms(values: dict[str, float], dropped: list[str] | None = None
                         ) -> dict[str, float]:
    """A line's values less the loss terms that are a mean over no samples, and the total
    they made NaN. A term `X_loss` that is NaN while its own accuracy `X_acc` is NaN too, beside
    another term that is finite, is a task the batch had no labels of (wetts' prosody and
    polyphone heads): an accuracy is a count's share, NaN only over nothing, where a diverged
    model still gets a number. A NaN total beside it is no value either; a NaN term with a
    finite accuracy, or no other finite term, is read as the NaN it is. `dropped` gets the
    names left out."""
    empty: list[str] = []
    terms: list[str] = []
    for name, value in values.items():
        lowered = name.lower()
        if not (lowered.endswith(("_loss", " loss")) and len(name) > 5):
            continue
        terms.append(name)
        accuracies = [name[:-5] + suffix for suffix in _ACCURACY if name[:-5] + suffix in values]
        if (math.isnan(value) and accuracies
                and all(math.isnan(values[a]) for a in accuracies)):
            empty.extend([name, *accuracies])
    if not empty or not any(math.isfinite(values[t]) for t in terms if t not in empty):
        return values
    kept = {k: v for k, v in values.items() if k not in empty}
    for name, value in list(kept.items()):
        if name not in terms and is_loss_name(name) and math.isnan(value):
            del kept[name]  # the total over the terms, NaN by the empty one
    if dropped is not None:
        dropped.extend(name for name in values if name not in kept)
    return kept


def rows_of(lines: Iterable[str], empty: list[str] | None = None
            ) -> tuple[list[LineRow], list[tuple[int, dict[str, float]]], str | None]:
    """The training rows of the lines, evaluations (index of the row they follow, values), and
    what the rows stand in for when the lines hold no training loss (see below; None: they hold
    one). `empty` gets the names of the loss terms left out of a line as a mean over no
    samples (`_without_empty_terms`), once per line.

    Lines that hold no training loss at all but an evaluation's loss (`Validation loss 6312:
    0.149928` and nothing else) are the log's rows, that loss read as the loss; failing that,
    lines that hold a gradient norm (`"grad_norm": 1.31,`, cut from a metrics file) are, with
    no loss; failing both, lines that hold a reward (`Episode 100  Average Score: -225.0`, an RL
    loop that prints only its episodes' return); failing all three, lines that hold a score
    (`<epoch: 99, iter: 5,000> psnr: 2.9862e+01.`, a validation that prints only its score):
    what the log says of the run is what is judged (`read_rows` notes it)."""
    rows: list[LineRow] = []
    evals: list[tuple[int, dict[str, float]]] = []
    stand_ins = _StandIns()
    epoch: float | None = None
    ahead: dict[str, Any] | None = None  # a line holding its step alone, before its values
    overflow = False  # a loss scaler skipped the step of the next row
    for line in _records(_joined_objects(part for raw in lines for part in raw.split("\r"))):
        if OVERFLOW.search(line):
            overflow = True
            continue
        if _HEADING.match(line):
            continue
        header = _EPOCH_HEADER.match(_ANSI.sub("", line))
        if header:
            epoch = float(header.group(1))
            continue
        values, counters = parse_line(line)
        if not values:
            ahead = _ahead(counters) or ahead
            continue
        values = _line_values(line, values, empty)
        if TOTALS & set(values):
            continue
        if "epoch" in counters:
            epoch = counters["epoch"]
        elif "epoch" in values:
            epoch = values["epoch"]
        if not any(is_loss_name(name) for name in values):
            evaluation = {k: v for k, v in values.items() if is_eval_name(k)}
            losses = [k for k in evaluation if "loss" in k.lower()
                      or _unprefixed(k).lower() in LOSS_WORDS]
            if losses and not rows:
                stand_ins.keep(EVALUATION_LOSS, LineRow(
                    {EVAL_AS_LOSS: evaluation[losses[0]]},
                    {k: v for k, v in counters.items() if k not in (SPELLING, TOTAL, WITHIN)},
                    epoch, str(counters.get(SPELLING, "step"))))
            if evaluation and rows:
                evals.append((len(rows) - 1, evaluation))
            elif (owner := _row_of_step(rows, counters)) is not None:
                for name, value in values.items():  # Caffe's `Iteration N, lr = X`
                    owner.values.setdefault(name, value)
            elif _number_leading(rows, counters):
                for name, value in values.items():
                    rows[-1].values.setdefault(name, value)
            elif not rows and not evaluation and (kind := _stand_in(values)) is not None:
                stand_ins.keep(kind, _line_row(values, counters, epoch))
            elif not rows and _epochs_scores(evaluation, values, counters):
                # a validation's scores alone (`epoch 3 | val_acc 0.61`): its quality metric
                stand_ins.keep(EVALUATION_QUALITY, _line_row(values, counters, epoch))
            elif not evaluation and _ahead(counters) is not None:
                ahead = counters
            continue
        if ahead is not None and not set(counters) & (AHEAD | {"progress"}):
            counters = ahead | counters  # NeMo's `Step: 2100` line, then `Loss: 100.46`
        ahead = None
        rows.append(_line_row(values, counters, epoch))
        rows[-1].skipped, overflow = overflow, False
        if len(rows) > MAX_ROWS:
            raise TooLong
    if not rows and (picked := stand_ins.pick()) is not None:
        return picked[0], [], picked[1]
    rows, evals = _one_rank(rows, evals)
    return _merge_reprints(rows), evals, None


def _epochs_scores(evaluation: dict[str, float], values: dict[str, float],
                   counters: dict[str, float]) -> bool:
    """Whether a line with no loss is an epoch's validation scores (`epoch 3 | val_acc 0.61`):
    its epoch named, its values an evaluation's quality scores only, no LR beside them (a
    sweep's trials, a fold's or a class's results, an evaluation loop's batches are no run's
    course)."""
    return ("epoch" in counters and bool(evaluation) and len(evaluation) == len(values)
            and _stand_in(evaluation) == QUALITY_ONLY)


def _stand_in(values: dict[str, float]) -> str | None:
    """What a line with no loss and no evaluation may stand in for a loss with: a gradient
    norm, a reward or a score, in that order (None: none of them)."""
    if GRAD_NORM in map(canonical_name, values):
        return GRAD_NORM
    if any(is_reward_name(name) for name in values):
        return REWARD_ONLY
    if any(QUALITY_NAME.search(name) for name in values):
        return QUALITY_ONLY
    return None


@dataclass(slots=True)
class _StandIns:
    """The rows of lines that hold no training loss, by what they stand in with: taken only
    when no line holds one (`rows_of`)."""

    rows: dict[str, list[LineRow]] = field(default_factory=dict)

    def keep(self, kind: str, row: LineRow) -> None:
        kept = self.rows.setdefault(kind, [])
        kept.append(row)
        if len(kept) > MAX_ROWS:
            raise TooLong

    def pick(self) -> tuple[list[LineRow], str] | None:
        """The rows an evaluation's loss stands in for, failing them a gradient norm's, a
        reward's, then a score's, then an epoch's validation scores' (at least `QUALITY_FEWEST` of
        either), with their kind."""
        for kind in (EVALUATION_LOSS, GRAD_NORM, REWARD_ONLY, QUALITY_ONLY, EVALUATION_QUALITY):
            rows = self.rows.get(kind, [])
            if rows and (kind not in (QUALITY_ONLY, EVALUATION_QUALITY)
                         or len(rows) >= QUALITY_FEWEST):
                return (rows if kind == GRAD_NORM else _merge_reprints(rows)), kind
        return None


def _one_rank(rows: list[LineRow], evals: list[tuple[int, dict[str, float]]]
              ) -> tuple[list[LineRow], list[tuple[int, dict[str, float]]]]:
    """The rows of the lowest rank, when lines of several ranks are interleaved (each names
    its `rank N`): every rank prints its own loss of the same step, and read in turn they make
    a sawtooth no run has. Evaluations stay, after the kept row they followed."""
    ranks = {rank for row in rows if (rank := row.values.get("rank")) is not None}
    if len(ranks) < 2:
        return rows, evals
    lowest = min(ranks)
    kept: list[LineRow] = []
    new_index: list[int] = []  # for each old row, the index of the last kept row at or before it
    for row in rows:
        if row.values.pop("rank", lowest) == lowest:  # the rank is no value of the run
            kept.append(row)
        new_index.append(len(kept) - 1)
    return kept, [(max(new_index[after], 0), {k: v for k, v in values.items()
                                              if k not in ("rank", "eval_rank")})
                  for after, values in evals
                  if values.get("rank", values.get("eval_rank", lowest)) == lowest]


EVALUATION_LOSS = "evaluation loss"
REWARD_ONLY = "reward"
QUALITY_ONLY = "quality"
EVALUATION_QUALITY = "evaluation quality"
QUALITY_NAME = re.compile(r"(^|[\s_/])(psnr|ssim|acc|accuracy|top-?[15]|f1|bleu|rouge\w*|m?iou|"
                          r"map|auc)($|[\s_/@])", re.IGNORECASE)
"""A measure of quality where higher is better (`psnr`, `top1`, `BLEU`): what a log that prints
only its evaluations' scores says of the run."""
QUALITY_FEWEST = 5
"""Lines of scores a log of nothing else needs to be read as one (a line or two of `acc 0.5` in
notes is no log)."""


MAX_RECORD = 4096
"""Characters a record wrapped over several lines holds at most (past them, it has ended)."""
AHEAD = frozenset({"step", "batch"})
"""The counters a line may hold alone, numbering the values on the lines after it (NeMo's
`Step: 2100` then `Loss: 100.46`; Composer's `[batch=12/100]:` then one value a line; the TF
Object Detection API's `Step 100 per-step time 0.5s` then its loss dict): the next row without a
counter of its own takes it."""
OBJECT_LINES = 64
"""Lines a `{...}` object printed over several (pprint's dict, a pretty-printed JSON record)
holds at most: past them, the lines are read one by one."""


def _ahead(counters: dict[str, Any]) -> dict[str, Any] | None:
    """`counters` when they are a step a line gives ahead of its values (`AHEAD`), else None."""
    if set(counters) & AHEAD and not set(counters) & {"progress", "epoch"}:
        return counters
    return None


def _joined_objects(lines: Iterable[str]) -> Iterable[str]:
    """The lines, with an object that opens on one and closes on a later one joined into one
    line (`{'Loss/total_loss': 0.95,` ... `'learning_rate': 0.04}` is one record); an object
    that does not close within `OBJECT_LINES` lines leaves its lines as they were, the first
    given alone and the others read again (the inner objects of a pasted JSON file)."""
    source = iter(lines)
    again: list[str] = []
    held: list[str] = []
    depth = 0
    while True:
        line = again.pop() if again else next(source, None)
        if line is None:
            if not held:
                return
            yield held[0]
            again.extend(reversed(held[1:]))
            held, depth = [], 0
            continue
        opened = line.count("{") - line.count("}")
        if not held:
            if opened > 0:
                held, depth = [line], opened
            else:
                yield line
            continue
        held.append(line)
        depth += opened
        if depth <= 0:
            yield " ".join(part.strip() if i else part.rstrip() for i, part in enumerate(held))
            held, depth = [], 0
        elif len(held) > OBJECT_LINES:
            yield held[0]
            again.extend(reversed(held[1:]))
            held, depth = [], 0


def _records(lines: Iterable[str]) -> Iterable[str]:
    """The lines cut into records where one line holds several (records printed without a line
    break, or wrapped at a width: `Epoch #1 Loss: 0.55 Accuracy: 0.72 Epoch #2 Loss:` then
    `0.43 ...`): before each counter whose word is the same as the line's first counter's and
    whose number goes up, when it is so on the line more than once. From such a line to the
    next blank one, the lines are one text wrapped: a record goes on over the line break."""
    pending: str | None = None
    for line in lines:
        if pending is not None and (not line.strip() or len(pending) > MAX_RECORD):
            yield pending
            yield line
            pending = None
            continue
        text = line if pending is None else f"{pending} {line}"
        records = _cut(text)
        if pending is None and len(records) < 2:
            yield line
            continue
        yield from records[:-1]
        pending = records[-1]
    if pending is not None:
        yield pending


def _cut(text: str) -> list[str]:
    """`text` cut before each of its records (see `_records`); itself when it holds one."""
    starts = [(m.start(), m.group(1).lower(), int(m.group(2)))
              for m in _COUNTER_AT.finditer(text)]
    same = [(at, n) for at, word, n in starts if word == starts[0][1]]
    if len(same) < 2 or any(b <= a for (_, a), (_, b) in itertools.pairwise(same)):
        return [text]
    cuts = [0, *(at for at, _ in same[1:]), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(cuts)]


def _line_values(line: str, values: dict[str, float], empty: list[str] | None
                 ) -> dict[str, float]:
    """The line's values as a row holds them: empty loss terms left out, an evaluation's line's
    named as such (fairseq's `| valid |`), a perplexity alone read as its log, the loss."""
    values = _without_empty_terms(values, empty)
    if (_EVAL_FIELD.search(line) or _EVAL_PHASE.search(line) or _EVAL_HEAD.search(line)
            or _EVAL_SET.search(line)):
        values = {k if is_eval_name(k) else f"eval_{k}": v for k, v in values.items()}
    if not any(is_loss_name(name) for name in values):
        ppl = next((name for name in values if name.lower() in PERPLEXITY), None)
        if ppl is not None:  # a perplexity is exp(cross-entropy): the loss is its log
            value = values[ppl]
            values["loss"] = math.log(value) if value > 0 else math.nan
    return values


def _line_row(values: dict[str, float], counters: dict[str, float],
              epoch: float | None) -> LineRow:
    values.pop("epoch", None)
    spelling = counters.pop(SPELLING, "step")
    total = counters.pop(TOTAL, None)
    within = counters.pop(WITHIN, "")
    return LineRow(values, counters, epoch, str(spelling), total, str(within))


EVAL_AS_LOSS = "loss"
"""The name an evaluation's loss is read under in a log that holds no training loss."""


def _row_of_step(rows: list[LineRow], counters: dict[str, float]) -> LineRow | None:
    """The last row carrying the line's step (the rows after it carry none): a line of more
    values of that step."""
    step = counters.get("step")
    if step is None:
        return None
    for row in reversed(rows):
        if "step" in row.counters:
            return row if row.counters["step"] == step else None
    return None


def _number_leading(rows: list[LineRow], counters: dict[str, float]) -> bool:
    """Rows at the head of a log, none carrying a step, followed by a line that holds a step and
    no loss: that line closes their record, whose first line the paste cut off (Caffe prints
    `Iteration N, loss = X`, its `Train net output` lines, then `Iteration N, lr = Y`; a paste
    that starts inside a record starts with its `Train net output` lines). They take its step."""
    step = counters.get("step")
    if step is None or not rows or any("step" in row.counters for row in rows):
        return False
    spelling = str(counters.get(SPELLING, "step"))
    for row in rows:
        row.counters["step"] = step
        row.spelling = spelling
    return True


TWIN_AGREEMENT = 2
"""Rows on which the loss and another loss-named value must agree, and none disagree, before
that value stands for the loss on a row without one."""


def _fill_loss_from_its_twin(rows: list[LineRow]) -> None:
    """A record without `loss` takes it from the one other loss-named value it holds, where that
    value is the loss printed again under its own name in every record holding both (Caffe's
    `Iteration N, loss = X` beside `Train net output #1: softmax_loss = X`: a record whose
    `Iteration` line was cut off still holds its softmax_loss). A record is the rows of one step
    (each row its own where the rows carry none)."""
    records: dict[object, dict[str, float]] = {}
    for row in rows:
        records.setdefault(row.counters.get("step", id(row)), {}).update(row.values)
    missing = [key for key, values in records.items() if "loss" not in values]
    if not missing or len(missing) == len(records):
        return
    twins = {name for key in missing for name in records[key] if is_loss_name(name)}
    if len(twins) != 1:
        return
    twin = twins.pop()
    both = [values for values in records.values() if "loss" in values and twin in values]
    if len(both) < TWIN_AGREEMENT or not all(_agree(v["loss"], v[twin]) for v in both):
        return
    for row in rows:
        key = row.counters.get("step", id(row))
        if key in missing and twin in row.values:
            row.values["loss"] = row.values[twin]


def _inherit_steps(rows: list[LineRow]) -> None:
    """Rows without a step counter among rows that mostly carry one belong to the step before
    them (Caffe prints `Iteration N, loss = X` and then `Train net output #0: loss = X`)."""
    carrying = sum("step" in row.counters for row in rows)
    if not carrying or carrying == len(rows) or carrying * 2 < len(rows):
        return
    last: LineRow | None = None
    for row in rows:
        if "step" in row.counters:
            last = row
        elif last is not None:
            row.counters["step"] = last.counters["step"]
            row.spelling = last.spelling


def _fold_records(rows: list[LineRow], evals: list[tuple[int, dict[str, float]]]
                  ) -> tuple[list[LineRow], list[tuple[int, dict[str, float]]]]:
    """Records of one shape printed over several lines, each a line with the step and the same
    number of lines without one after it (`iter: 200 / 70000, total loss: nan`, then a line per
    loss term: ` >>> rpn_loss_box: nan`), folded into one row each: the step lines at a fixed
    period from the first row, the last record no longer than the others. Rows that mostly
    carry the step are left to `_inherit_steps`; the evaluations follow their record."""
    at = [i for i, row in enumerate(rows) if "step" in row.counters]
    if len(at) < 2 or at[0] != 0 or len(at) * 2 >= len(rows):
        return rows, evals
    period = at[1]
    if not (all(b - a == period for a, b in itertools.pairwise(at))
            and len(rows) - at[-1] <= period):
        return rows, evals
    for i, row in enumerate(rows):
        if i % period:
            for name, value in row.values.items():
                rows[i - i % period].values.setdefault(name, value)
    return [rows[i] for i in at], [(after // period, values) for after, values in evals]


def _merge_split_records(rows: list[LineRow], evals: list[tuple[int, dict[str, float]]]
                         ) -> tuple[list[LineRow], list[tuple[int, dict[str, float]]]]:
    """A step's values printed one to a line, each line with the step (`(Step: 95400)
    train_f0_loss = 0.0659.`, then the next loss term of step 95400): consecutive rows with the
    same step, each with a value the other has not and the same value for the names they
    share (the logger's own `(module:line)`), are one row; the evaluations follow their row."""
    out: list[LineRow] = []
    index: list[int] = []  # each row's position in `out`
    for row in rows:
        last = out[-1] if out else None
        if (last is not None and "step" in row.counters
                and row.counters.get("step") == last.counters.get("step")
                and row.epoch == last.epoch and set(row.values) - set(last.values)
                and all(name not in last.values or last.values[name] == value
                        for name, value in row.values.items())):
            last.values.update(row.values)
            last.skipped = last.skipped or row.skipped
        else:
            out.append(row)
        index.append(len(out) - 1)
    if len(out) == len(rows):
        return rows, evals
    return out, [(index[after], values) for after, values in evals]


def _merge_reprints(rows: list[LineRow]) -> list[LineRow]:
    """One row printed twice in a row by two handlers (other names, one rounded) is one row."""
    out: list[LineRow] = []
    for row in rows:
        if out and _same_row(out[-1], row):
            merged = out[-1]
            for name, value in row.values.items():
                if name not in merged.values or _more_digits(value, merged.values[name]):
                    merged.values[name] = value
            merged.counters.update({k: v for k, v in row.counters.items()
                                    if k not in merged.counters})
            continue
        out.append(row)
    return out


def _same_row(a: LineRow, b: LineRow) -> bool:
    if set(a.values) == set(b.values) or a.epoch != b.epoch:
        return False
    common = set(a.values) & set(b.values)
    if not any(is_loss_name(name) for name in common) or len(common) < 2:
        return False
    for counter in set(a.counters) & set(b.counters):
        if a.counters[counter] != b.counters[counter]:
            return False
    return all(_agree(a.values[name], b.values[name]) for name in common)


def _agree(x: float, y: float) -> bool:
    if not (math.isfinite(x) and math.isfinite(y)):
        return (math.isnan(x) and math.isnan(y)) or x == y
    return abs(x - y) <= ROUNDING * max(abs(x), abs(y)) or abs(x - y) <= 5e-5


def _more_digits(x: float, y: float) -> bool:
    return len(repr(x)) > len(repr(y))


MAX_ROWS = 1 << 16
"""Rows of free-form lines read at most. Which counter numbers them, and which line repeats
another, is told only from all of them, so all are kept (some 2 KB each): a longer log comes
from a trainer whose own grammar reads it in bounded memory, not from a paste."""


class TooLong(Exception):
    """More than `MAX_ROWS` rows."""


_AVERAGED = re.compile(rf"loss\w*\s*[:=]?\s*{NUM}\s*\(\s*{NUM}\s*\)", re.IGNORECASE)
"""A loss printed with its running average in parentheses (`Loss 8.4238 (10.3028)`: PyTorch's
`AverageMeter`, as the ImageNet example, timm and many forks print it): the first value is one
batch's."""


@dataclass(slots=True)
class _Averaged:
    """Counts, as the lines go by, those that print a loss and those that print it beside its
    running average."""

    printed: int = 0
    averaged: int = 0

    def watch(self, lines: Iterable[str]) -> Iterator[str]:
        for line in lines:
            if "loss" in line.lower():
                self.printed += 1
                self.averaged += _AVERAGED.search(line) is not None
            yield line

    def most(self) -> bool:
        """Most lines that print a loss print its running average beside it: the log's rows
        are single batches' losses, however many steps apart they are written."""
        return self.printed > 0 and 2 * self.averaged > self.printed


def read_rows(lines: Iterable[str], log: LogBuilder) -> int:
    """Add the training rows of `lines` to `log`; the number of rows found."""
    averaged = _Averaged()
    try:
        empty: list[str] = []
        rows, evals, stand_in = rows_of(averaged.watch(lines), empty)
    except TooLong:
        raise LogError(f"{log.path}: more than {MAX_ROWS} rows of free-form log lines, too "
                       "many to read as a paste; give --format with the trainer's own line "
                       "format (see `trainguard analyze --help`), or a part of the log") from None
    if not rows:
        return 0
    log.single_batch = averaged.most()
    _check_counters(rows, log.path)
    if stand_in == EVALUATION_LOSS:
        log.notes.append("the log holds no training loss: its evaluation loss is judged")
        log.loss_is_evaluation = True
    elif stand_in == GRAD_NORM:
        log.notes.append("the log holds no loss: its gradient norm is all it says of the run")
    elif stand_in == REWARD_ONLY:
        log.notes.append("the log holds no loss: its reward is all it says of the run (watched "
                         "for NaN and inf; a reward's level is not judged)")
    elif stand_in in (QUALITY_ONLY, EVALUATION_QUALITY):
        log.notes.append("the log holds no loss: its scores are all it says of the run "
                         "(watched for NaN and inf and for a fall off a cliff; a score's level "
                         "is not judged)")
    if empty:
        terms = sorted({name for name in empty
                        if name.lower().endswith(("_loss", " loss")) and len(name) > 5})
        log.notes.append(f"{len(empty)} NaN value(s) not read ({', '.join(terms)} and the "
                         "accuracies beside them, with the total they made NaN): a loss term "
                         "NaN on a line where its own accuracy is NaN too is a mean over no "
                         "samples, a batch without that task's labels")
    rows, evals = _fold_records(*_merge_split_records(rows, evals))
    _inherit_steps(rows)
    _fill_loss_from_its_twin(rows)
    counter = _numbering(rows)
    if counter == "step":
        spellings = [row.spelling for row in rows]
        log.step_unit = max(set(spellings), key=spellings.count).replace("global_", "global ")
    elif counter == ACROSS:
        log.step_unit = "sample" if rows[0].within == "sample" else "batch"
    elif counter is not None:
        log.step_unit = _UNITS.get(counter, counter)
    steps: list[int] = []
    for index, row in enumerate(rows):
        if counter == ACROSS:
            step = int(row.counters[counter])
            done = int(row.counters["progress"])
            # Keras' line of a whole epoch is its progress bar at its total
            label = (f"epoch {row.epoch:g}" if done == row.total and not row.within
                     else f"epoch {row.epoch:g}, {row.within or 'batch'} {done}")
        elif counter is not None:
            step = int(row.counters[counter])
            label = f"{log.step_unit} {step}"
        else:
            step = index + 1
            label = f"row {step}" + (f" (epoch {row.epoch:g})" if row.epoch is not None
                                     else "")
        steps.append(step)
        if stand_in == EVALUATION_QUALITY:
            # a validation's scores alone are the rows (`analyze/scores.py` judges them)
            log.add(step, row.values, label=label, skipped=row.skipped)
        else:
            log.add_values(step, list(row.values.items()), label=label, skipped=row.skipped)
    for after, values in evals:
        log.add_eval(steps[after], values)
    if counter is None:
        log.step_unit = "row"
        log.notes.append("the lines carry no step counter: rows are numbered from 1")
        log.from_start = _from_start(rows)
    return len(rows)


def _check_counters(rows: list[LineRow], path: str) -> None:
    """A counter beyond 64 bits, or not a number, is one clear error, as in JSONL and CSV logs
    (as a float, 2^70 + 1 equals 2^70: such a counter would be taken for no counter at all)."""
    for row in rows:
        for name, value in [*((n, row.counters.get(n)) for n in NUMBERING),
                            ("epoch", row.epoch)]:
            if value is None or (math.isfinite(value) and -MAX_STEP <= value < MAX_STEP):
                continue
            spelling = row.spelling if name == "step" else name
            if math.isnan(value):
                raise LogError(f"{path}: {spelling} nan is not a step number")
            shown = f"{int(value)}" if math.isfinite(value) else f"{value}"
            raise LogError(f"{path}: {spelling} {shown} is beyond any training step (|step| < "
                           f"2^63 is read)")


_UNITS = {"progress": "step"}


ACROSS = "epoch_progress"


def _across_epochs(rows: list[LineRow]) -> None:
    """A progress counter that restarts each epoch (`Epoch 2 ... 100/1500 [`) numbers the rows
    across epochs as (epoch - first epoch) x total + progress, under `ACROSS`: in steps, so
    that a row that closes an epoch (Keras' `9595/9595 [====] - loss: ...`) is known as the mean
    of a whole epoch of steps."""
    if rows and all(row.epoch is not None and row.total is None for row in rows):
        _restarting(rows)
    if not rows or any(row.epoch is None or row.total is None or "progress" not in row.counters
                       for row in rows):
        return
    first = rows[0].epoch
    for row in rows:
        row.counters[ACROSS] = ((row.epoch - first) * row.total  # type: ignore[operator]
                                + row.counters["progress"])


def _restarting(rows: list[LineRow]) -> None:
    """A counter that starts again with each epoch (`epoch: 2, iter: 20`) is a progress within
    the epoch, of a total the largest value it reaches: the rows are then numbered across
    epochs and named as the lines name them (`epoch 2, iter 20`)."""
    for name in ("step", "batch"):
        values = [row.counters.get(name) for row in rows]
        if any(v is None or v != int(v) or v < 0 for v in values):
            continue
        backs = [k for k in range(1, len(rows)) if values[k] <= values[k - 1]]  # type: ignore[operator]
        if not backs or any(rows[k].epoch <= rows[k - 1].epoch for k in backs):  # type: ignore[operator]
            continue  # it never restarts, or not at a new epoch: the counter numbers the rows
        total = max(values)  # type: ignore[type-var]
        for row, value in zip(rows, values, strict=True):
            row.counters["progress"] = float(value)  # type: ignore[arg-type]
            row.total = float(total)  # type: ignore[arg-type]
            row.within = row.spelling if name == "step" else name
            del row.counters[name]
        return


def _from_start(rows: list[LineRow]) -> bool | None:
    """Rows numbered from 1 begin at the start of training only if their epoch says so: an
    excerpt whose first row is at epoch 0.24, 0.01 apart, began mid-run."""
    epochs = [row.epoch for row in rows if row.epoch is not None]
    if not epochs:
        return None
    gaps = sorted(b - a for a, b in itertools.pairwise(epochs) if b > a)
    if not gaps:  # every row at one epoch: rows far closer than the epoch they are at
        return epochs[0] == 0
    return epochs[0] <= 2 * gaps[len(gaps) // 2] + 1e-9


def _numbering(rows: list[LineRow]) -> str | None:
    """The counter that numbers the rows: on nearly every row, whole, never going back, and
    distinct on most of them (a row printed twice shares its step)."""
    _across_epochs(rows)
    best: tuple[int, int, str] | None = None
    for rank, name in enumerate((ACROSS, *NUMBERING)):
        values = [row.counters.get(name) for row in rows]
        if name == "epoch":
            values = [row.epoch for row in rows]
        present = [v for v in values if v is not None]
        if len(present) < len(rows) or any(v != int(v) or v < 0 for v in present):
            continue
        if any(b < a for a, b in itertools.pairwise(present)):
            continue
        distinct = len(set(present))
        if (distinct < 0.4 * len(rows) and len(rows) > 2) or (distinct < 2 and len(rows) > 1):
            continue
        candidate = (distinct, -rank, name)
        if best is None or candidate > best:
            best = candidate
    if best is None:
        return None
    name = best[2]
    if name == "epoch":  # an epoch may come from an `Epoch 2/10` line before the row
        for row in rows:
            row.counters["epoch"] = row.epoch  # type: ignore[assignment]
    return name
