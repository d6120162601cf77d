"""Opening the files of a log: regular files only, read a bounded piece at a time.

Every file `analyze` reads goes through `open_regular`, the files it finds inside a folder
(`checkpoint-N/trainer_state.json`, `version_N/metrics.csv`, event files) as much as the path it
was given: a FIFO under a log's name would block the reader for ever, and a link to
`/dev/zero` would be read until memory ran out. The file is opened without blocking and checked
on the open handle, so a file swapped for a pipe after a check cannot slip through.

Text is read a piece at a time and cut into lines (`Lines`), never whole, so the memory a
reader needs does not grow with the file. A line longer than `MAX_LINE` characters is no
training log line: the text grammars leave it out with a note. A format of one record per line
(JSON Lines, CSV) refuses a line longer than `MAX_RECORD`: its records can be wide (a Lightning
metrics.csv with a column per parameter's gradient norm has a header of megabytes).
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from trainguard.analyze.log import LogError

MAX_LINE = 1 << 20
"""Characters of the longest line read (a Megatron line is ~600, a logged dict ~200)."""
MAX_RECORD = 1 << 26
"""Characters of the longest record of a one-record-per-line format (a CSV header of 100k
columns is ~2.5M)."""
_PIECE = 1 << 20
"""Bytes (or characters) read at a time."""


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading in binary, if it is a regular file; a `LogError` naming it
    otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise LogError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise LogError(f"{path}: not a regular file (a pipe, socket, device or directory)")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class Lines:
    """The text lines of a file, one at a time, as `str.splitlines` would cut the whole text.

    `ended`: whether the file's last line ended with a line break (known once read to the end);
    `long`: how many lines longer than `max_line` were left out (`skip_long`), else the first
    such line is a `LogError`."""

    def __init__(self, path: Path, *, errors: str = "replace", skip_long: bool = True,
                 max_line: int = MAX_LINE) -> None:
        self.path = path
        self.max_line = max_line
        self.errors = errors
        self.skip_long = skip_long
        self.ended = True
        self.long = 0

    def __iter__(self) -> Iterator[str]:
        self.long = 0  # each reading counts its own (the grammars read a file in turn)
        with open_regular(self.path) as raw:
            # newline=None makes every \r\n and \r a \n, also across pieces: cutting each
            # piece with splitlines then cuts as the whole text would be cut
            text = io.TextIOWrapper(raw, encoding="utf-8", errors=self.errors, newline=None)
            carry = ""
            number = 0
            skipping = False  # the rest of a line too long to keep
            while piece := text.read(_PIECE):
                parts = (carry + piece).splitlines(keepends=True)
                carry = parts.pop() if parts[-1][-1] not in _BREAKS else ""
                if skipping:
                    if not parts:  # still inside the long line
                        carry = ""
                        continue
                    del parts[0]  # its end
                    number += 1
                    skipping = False
                elif parts and len(parts[0]) > self.max_line + 1:  # a line held over, ended here
                    self._too_long(number + 1)
                    del parts[0]
                    number += 1
                number += len(parts)
                for part in parts:
                    yield part[:-1]
                if len(carry) > self.max_line:
                    self._too_long(number + 1)
                    carry, skipping = "", True
            self.ended = not carry and not skipping
            if carry:
                yield carry

    def _too_long(self, number: int) -> None:
        if not self.skip_long:
            raise LogError(f"{self.path}: line {number} is longer than {self.max_line} characters "
                           "(no logged record is that long)")
        self.long += 1

    def note(self) -> str | None:
        """What was left out, for the log's notes."""
        if not self.long:
            return None
        return (f"{self.long} line(s) longer than {self.max_line} characters are left out (no "
                "training log line is that long)")


_BREAKS = frozenset("\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
"""What `str.splitlines` cuts at, once `\r` is read as `\n`."""


def head(path: Path, size: int = 4096) -> bytes:
    """The first `size` bytes of a regular file."""
    with open_regular(path) as handle:
        try:
            return handle.read(size)
        except OSError as exc:
            raise LogError(f"{path}: cannot be read ({exc.strerror or exc})") from None


MAX_STDIN = 1 << 29
"""Bytes read from standard input at most: what is piped in may never end (`< /dev/zero`,
`yes`), and is kept on disk until it does."""
WAIT_NOTICE_S = 2.0
"""How long standard input may stay silent before `analyze -` says what it waits for."""


def copy_stdin(stream: BinaryIO, into: BinaryIO, notice: TextIO, *,
               limit: int = MAX_STDIN, silence_s: float = WAIT_NOTICE_S) -> int:
    """Copy `stream` (standard input) to `into` a piece at a time, at most `limit` bytes; the
    bytes copied. A terminal is told at once that a log is awaited, a pipe that stays silent
    for `silence_s` seconds once; more than `limit` bytes is a `LogError`."""
    if stream.isatty():
        print("trainguard: reading a log from standard input: paste it, then Ctrl-D",
              file=notice, flush=True)
    elif not _ready(stream, silence_s):
        print("trainguard: waiting for a log on standard input (the pipe is open and nothing "
              "has come; Ctrl-C stops)", file=notice, flush=True)
    copied = 0
    while True:
        piece = stream.read1(_PIECE) if hasattr(stream, "read1") else stream.read(_PIECE)
        if not piece:
            return copied
        copied += len(piece)
        if copied > limit:
            raise LogError(f"more than {limit >> 20} MiB on standard input (a pipe that never "
                           "ends?); save the log to a file and give its path")
        into.write(piece)


def _ready(stream: BinaryIO, timeout: float) -> bool:
    """Whether `stream` has something to read (or its end) within `timeout` seconds; True where
    that cannot be asked (no file descriptor, a platform whose select takes sockets only)."""
    import select

    try:
        readable, _, _ = select.select([stream.fileno()], [], [], timeout)
    except (OSError, ValueError, io.UnsupportedOperation):
        return True
    return bool(readable)
