"""The console tables of OpenAI baselines and stable-baselines (RL trainers), as printed.

Two shapes:

    the logger's table, one block per update, between dashed rules (baselines `logger.dumpkvs`,
    stable-baselines, Stable-Baselines3 with its `section/` headers):

        ---------------------------------------
        | approxkl           | 0.0012         |
        | nupdates           | 3              |
        | policy_loss        | -0.0053        |
        | total_timesteps    | 6144           |
        ---------------------------------------

    PPO1's optimisation table, a header of names between `|`, then one line of numbers per
    optimisation epoch, after a `***** Iteration N *****` banner:

             pol_surr |    pol_entpen |       vf_loss |            kl |           ent
              0.95906 |       0.00000 |      1.73e+05 |       0.01685 |      -0.34684

    the same `| name | value |` lines without the rules (baselines ACKTR, as pasted), after an
    `Iteration N` line that numbers them:

        Iteration 3026
        kl too low

        | EpRewMean | -7.31       |
        | KL        | 0.000913428 |

A block is a row numbered by the update counter it holds (`nupdates`, `iterations`,
`n_updates`, else `total_timesteps`), named as the table writes it (`nupdates 3`), else by the
`Iteration N` line before it (`iteration 3026`); without rules, a block is the run of `| name |
value |` lines that a line of anything else ends, and only a numbered block of two values or
more is a row (a stray cell in prose is not a table). PPO1's lines
are rows named `iteration 10, epoch 2` (its 2nd optimisation epoch), numbered in order. Every
numeric column is read under its own name (a section's prefix dropped); the training loss is
`loss` where the table has it, else its first other loss column (`analyze.log.choose_loss`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from trainguard.analyze.log import LogBuilder, number

_RULE = re.compile(r"^\s*-{8,}\s*$")
_CELL = re.compile(r"^\s*\|\s*([A-Za-z_][^|]*?)\s*\|\s*([^|]*?)\s*\|\s*$")
_BANNER = re.compile(r"\*{3,}\s*Iteration\s+(\d+)\s*\*{3,}", re.IGNORECASE)
_ITERATION = re.compile(r"^[\s*=#-]*Iteration\s+(\d+)[\s*=#-]*$", re.IGNORECASE)
"""A line that only names the iteration the table after it belongs to (`Iteration 3026`, PPO1's
`***** Iteration 10 *****`)."""
UNRULED_FEWEST = 2
"""Values a table without rules holds at the least to be read as one."""
_NUM = re.compile(r"^[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)$", re.IGNORECASE)
COUNTERS = ("nupdates", "iterations", "n_updates", "total_timesteps", "serial_timesteps",
            "timesteps")
"""The counters that number a block, in order of preference (updates before samples)."""


def read_rows(lines: Iterable[str], log: LogBuilder) -> int:
    """Rows from the tables among `lines` (the logger's blocks where there are any, else PPO1's
    optimisation tables); the number of table lines recognised."""
    return _blocks(lines, log) or _unruled(lines, log) or _epochs(lines, log)


def _blocks(lines: Iterable[str], log: LogBuilder) -> int:
    found = rows = 0
    block: dict[str, float] = {}
    section = ""
    ruled = False  # a block is a table's only between dashed rules
    for line in lines:
        if _RULE.match(line):
            ruled = True
            if block:
                rows += 1
                _add_block(log, block, rows)
                found += len(block)
            block, section = {}, ""
            continue
        cell = _CELL.match(line) if ruled else None
        if cell is None:
            continue
        name, raw = cell.group(1), cell.group(2)
        if name.endswith("/") and not raw:
            section = name  # a Stable-Baselines3 section header: `| train/ |  |`
            continue
        value = number(raw) if _NUM.match(raw) else None
        if value is not None:
            block[name.removeprefix(section).strip() if section else name] = value
    if block:  # a paste cut before the closing rule
        rows += 1
        _add_block(log, block, rows)
        found += len(block)
    return found


def _unruled(lines: Iterable[str], log: LogBuilder) -> int:
    found = rows = 0
    block: dict[str, float] = {}
    iteration: int | None = None

    def close() -> None:
        nonlocal found, rows
        numbered = iteration is not None or any(name in block for name in COUNTERS)
        if numbered and len(block) >= UNRULED_FEWEST:
            rows += 1
            _add_block(log, block, rows, iteration)
            found += len(block)

    for line in lines:
        cell = _CELL.match(line)
        if cell is not None:
            raw = cell.group(2)
            value = number(raw) if _NUM.match(raw) else None
            if value is not None:
                block[cell.group(1)] = value
            continue
        if block:
            close()
            block, iteration = {}, None
        header = _ITERATION.match(line)
        if header:
            iteration = int(header.group(1))
    if block:  # a paste that ends with its last table
        close()
    return found


def _epochs(lines: Iterable[str], log: LogBuilder) -> int:
    found = rows = epoch = 0
    iteration: int | None = None
    header: list[str] | None = None
    for line in lines:
        banner = _BANNER.search(line)
        if banner:
            iteration, header, epoch = int(banner.group(1)), None, 0
            continue
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 2 or not all(fields):
            continue
        if all(_NUM.match(f) for f in fields):
            if header is not None and len(fields) == len(header):
                epoch += 1
                rows += 1
                label = (f"iteration {iteration}, epoch {epoch}" if iteration is not None
                         else f"row {rows}")
                log.add_values(rows, zip(header, fields, strict=True), label=label)
                found += 1
        elif not any(_NUM.match(f) for f in fields) and all(
                re.fullmatch(r"[A-Za-z_][\w/]*", f) for f in fields):
            header = fields
    return found


def _add_block(log: LogBuilder, block: dict[str, float], row: int,
               iteration: int | None = None) -> None:
    counter = next((name for name in COUNTERS if name in block), None)
    values = {name: value for name, value in block.items() if name not in COUNTERS}
    if counter is None:
        if iteration is not None:
            log.add_values(iteration, values.items(), label=f"iteration {iteration}")
        else:
            log.add_values(row, values.items(), label=f"row {row}")
        return
    step = int(block[counter])
    log.add_values(step, values.items(), label=f"{counter} {step}")
