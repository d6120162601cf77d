"""Hugging Face Trainer `trainer_state.json`: its `log_history`.

Entries with a `loss`, `grad_norm` or `learning_rate` (and any other numbers a Trainer subclass
logs, such as `loss_total`) are training rows at their `step`; entries with `eval_*` keys are
evaluations; the run's closing totals (`train_runtime`, `total_flos`...) are left out. Two HF
habits are read for what they are, later, for every format (`trainguard.analyze.quirks`): a
`loss` of 0.0 beside a NaN `grad_norm` is a logging window whose losses were all NaN/inf (the
Trainer's `logging_nan_inf_filter`), and a learning rate that stays frozen on consecutive rows
under an active schedule is a run of skipped optimizer steps (fp16 GradScaler overflows).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from trainguard.analyze.log import Log, LogBuilder, LogError
from trainguard.analyze.source import open_regular

FORMAT = "hf"


def _cut_short(exc: json.JSONDecodeError) -> bool:
    """Whether the JSON broke off at its end, not inside: after where the parser stopped there is
    nothing, or only the start of a token (a string without its closing quote, `Infin`, `1.5e-`)."""
    rest = exc.doc[exc.pos:].strip()
    if exc.msg.startswith("Unterminated string") or (
            exc.msg.startswith("Invalid \\uXXXX") and len(rest) <= 6):
        return True
    return exc.msg != "Extra data" and re.fullmatch(r"[\w.+-]*", rest) is not None


def read(path: str | Path) -> Log:
    path = Path(path)
    document = _Document(path)
    log: LogBuilder | None = None
    for key in document.keys():
        if key != "log_history":
            document.skip_value()
            continue
        log = LogBuilder(path, FORMAT)  # a key given twice: the last one, as json.loads reads
        if not document.starts_array():
            kind = type(document.value()).__name__
            raise LogError(f"{path}: log_history is {kind}, expected a list of log entries")
        for number, entry in enumerate(document.items()):
            _add_entry(path, log, number, entry)
    if log is None:
        raise LogError(f"{path}: not a Hugging Face trainer_state.json (it has no log_history)")
    return log.build(what="training entries in log_history")


def _add_entry(path: Path, log: LogBuilder, number: int, entry: object) -> None:
    if not isinstance(entry, dict):
        raise LogError(f"{path}: log_history entry {number} is {type(entry).__name__}, "
                       "expected an object")
    if "train_runtime" in entry:  # the closing totals: `train_loss` is the run's mean loss
        return
    step = entry.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        raise LogError(f"{path}: log_history entry {number} has no whole-number step "
                       f"(step is {step!r})")
    log.add_entry(step, entry)


_SPACE = " \t\n\r"
MAX_VALUE = 1 << 26
"""Characters of one entry (or one other value of the state) at most."""


class _Document:
    """A `trainer_state.json` read a piece at a time: its top-level keys, and the entries of
    `log_history` one by one, each parsed by `json` (a whole state of 200 MB would take some
    4 GB as Python objects). Errors are `json.loads`' own, at the file's own line and column,
    said to be a truncated file when the JSON breaks off at its end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._raw = open_regular(path)
        self._text = io.TextIOWrapper(self._raw, encoding="utf-8-sig", errors="strict")
        self._decoder = json.JSONDecoder()
        self._buf = ""
        self._at = 0
        self._eof = False
        self._lines = 0  # line breaks in the text dropped before `_buf`
        self._column = 0  # characters after the last of them

    # -- the document's structure ------------------------------------------------------------
    def keys(self) -> Iterator[str]:
        try:
            if not self._skip_space():
                raise LogError(f"{self.path}: the file is empty")
            if self._buf[self._at] != "{":
                self._value()  # a parse error, else a value that is no object
                raise LogError(f"{self.path}: not a Hugging Face trainer_state.json (it has no "
                               "log_history)")
            self._at += 1
            first = True
            while True:
                if not self._skip_space():
                    self._fail("Expecting property name enclosed in double quotes")
                if self._buf[self._at] == "}" and first:
                    break
                if not first:
                    self._expect(",", "Expecting ',' delimiter", close="}")
                    if self._closed:
                        break
                    self._skip_space()
                if not self._buf[self._at:self._at + 1] == '"':
                    self._fail("Expecting property name enclosed in double quotes")
                key = self._value()
                self._expect(":", "Expecting ':' delimiter")
                first = False
                yield str(key)
            self._at += 1
            if self._skip_space():
                self._fail("Extra data")
        finally:
            self._raw.close()

    def skip_value(self) -> None:
        self._value()

    def value(self) -> object:
        return self._value()

    def starts_array(self) -> bool:
        if not self._skip_space():
            self._fail("Expecting value")
        if self._buf[self._at] != "[":
            return False
        self._at += 1
        return True

    def items(self) -> Iterator[object]:
        """The items of the array just started."""
        if not self._skip_space():
            self._fail("Expecting value")
        if self._buf[self._at] == "]":
            self._at += 1
            return
        while True:
            whole = self._whole_entries()
            if whole:
                yield from whole
            else:
                yield self._entry()
            buf, at = self._buf, self._at
            if at < len(buf) and buf[at] == ",":  # the usual delimiter, right after the entry
                self._at = at + 1
                continue
            self._expect(",", "Expecting ',' delimiter", close="]")
            if self._closed:
                return

    _unbatched: str | None = None
    """The piece in which the entries could not be parsed at once: read one by one."""

    def _whole_entries(self) -> list[object]:
        """The entries from here to the last `},` of the piece, parsed in one call, and the
        position moved to that comma; none when they do not parse as the items of an array
        (that `}` closes a value inside an entry, or is inside a string: a cut inside a string
        leaves it unterminated, so a cut that parses holds whole entries only). Parsed as
        JSON parses an array, they are the entries read one by one would be."""
        buf, at = self._buf, self._at
        if buf is self._unbatched:
            return []
        cut = buf.rfind("},", at)
        if cut - at < _BATCH:
            return []
        try:
            whole = self._decoder.decode("[" + buf[at:cut + 1] + "]")
        except json.JSONDecodeError:
            self._unbatched = buf
            return []
        self._at = cut + 1
        return whole

    def _entry(self) -> object:
        """`_value`, without its checks where they cannot matter: an entry that starts here
        and parses whole, far enough from the piece's end that no number can go on past it
        (the usual entry: what makes a log of a hundred thousand of them quick to read)."""
        buf, at = self._buf, self._at
        if at < len(buf) and buf[at] not in _SPACE:
            try:
                value, end = self._decoder.raw_decode(buf, at)
            except json.JSONDecodeError:
                return self._value()  # read on, or said as `_value` says it
            if len(buf) - end > _NUMBER:
                self._at = end
                return value
        return self._value()

    # -- reading -------------------------------------------------------------------------------
    _closed = False

    def _expect(self, char: str, message: str, close: str = "") -> None:
        """`char` next (or `close`, which ends the container: `_closed`)."""
        if not self._skip_space():
            self._fail(message)
        found = self._buf[self._at]
        self._closed = bool(close) and found == close
        if found != char and not self._closed:
            self._fail(message)
        self._at += 1

    def _skip_space(self) -> bool:
        """Past white space; False at the end of the file."""
        while True:
            while self._at < len(self._buf) and self._buf[self._at] in _SPACE:
                self._at += 1
            if self._at < len(self._buf):
                return True
            if not self._more():
                return False

    def _value(self) -> object:
        """The JSON value that starts here, read a piece more at a time until it is whole."""
        if not self._skip_space():
            self._fail("Expecting value")
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buf, self._at)
            except json.JSONDecodeError as exc:
                if _cut_short(exc) and self._more(grow=True):  # it may go on past the piece
                    continue
                raise self._error(exc.msg, exc.pos) from None
            # a number at the end of a piece may go on in the next
            if (len(self._buf) - end > _NUMBER
                    or _NUMBER_ON.fullmatch(self._buf, end) is None
                    or not self._more(grow=True)):
                self._at = end
                return value

    def _more(self, grow: bool = False) -> bool:
        """Read on: drop what was read, add a piece (twice as much as held, when a value
        being read needs more); False at the end of the file."""
        if self._eof:
            return False
        dropped = self._buf[:self._at]
        breaks = dropped.count("\n")
        self._lines += breaks
        self._column = (len(dropped) - dropped.rfind("\n") - 1 if breaks
                        else self._column + len(dropped))
        self._buf = self._buf[self._at:]
        self._at = 0
        if len(self._buf) > MAX_VALUE:
            raise LogError(f"{self.path}: a value of more than {MAX_VALUE} characters at line "
                           f"{self._lines + 1}; no log entry is that long")
        try:
            piece = self._text.read(max(_PIECE, len(self._buf)) if grow else _PIECE)
        except UnicodeDecodeError:
            raise LogError(f"{self.path}: not a JSON file (not UTF-8 text)") from None
        except OSError as exc:
            raise LogError(f"{self.path}: cannot be read ({exc.strerror or exc})") from None
        if not piece:
            self._eof = True
            return False
        self._buf += piece
        return True

    def _fail(self, message: str) -> NoReturn:
        raise self._error(message, self._at)

    def _error(self, message: str, pos: int) -> LogError:
        exc = json.JSONDecodeError(message, self._buf, pos)
        line = self._lines + exc.lineno
        column = exc.colno + (self._column if exc.lineno == 1 else 0)
        why = "the file is truncated" if self._eof and _cut_short(exc) else "the file is damaged"
        return LogError(f"{self.path}: not valid JSON ({message} at line {line}, column "
                        f"{column}): {why}")


_PIECE = 1 << 20
_BATCH = 1 << 12
"""Characters of entries worth parsing at once."""
_NUMBER = 32
_NUMBER_ON = re.compile(r"[\d.eE+-]*")
"""What may follow a number's first characters in the same number."""
