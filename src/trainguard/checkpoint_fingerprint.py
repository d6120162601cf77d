"""A checkpoint's fingerprint: what ties a sidecar to the very bytes it describes.

Taken when the checkpoint is marked, it holds two digests over the checkpoint's files (a file, or
a folder's files with trainguard's own left out), each a fixed size whatever the number of files:

- `content`: SHA-256 of each file's relative path, its size and sampled bytes: the whole file
  below `WHOLE_BELOW` (4 MiB), otherwise its first and last MiB (a safetensors header, a zip's
  directory) and one `BLOCK` (4 KiB, a page) every `STRIDE` (1 MiB) between them: 4 MiB read
  per GB, in 1,024 reads, and any change of a MiB or more in one piece (a tensor of 256k
  float32 values) is seen. It survives any copy (`cp -r`, a sync tool, an object store: names
  and bytes are kept, times and inodes are not) and changes when the weights are overwritten in
  place, whatever the file's times say.
- `identity`: SHA-256 of each file's device, inode, size, modification and status-change time.
  When it matches, no file was written, touched or replaced since the mark (the status-change
  time cannot be set back by `touch` or `os.utime`), and the content is not read again: the
  listing of an untouched folder costs one `stat` per file. A copy or a change falls through to
  the content digest.

A change confined between sampled blocks of a file larger than 4 MiB (a few values, or a tensor
smaller than a MiB away from the file's ends) goes unseen once the identity differs; a weight
file overwritten with NaN, or written again with other values, does not. Every file is opened
without blocking and read only if it is a regular file, within its size: a FIFO or a link to a
device is a token in the digest, as is a file that cannot be read (a dangling or looping symlink,
no permission), never a hang or an error. This module imports no torch.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEME = "sampled-sha256-1"
"""The sampling below; a sidecar with another scheme cannot be checked (`stale`)."""
WHOLE_BELOW = 4 << 20
HEAD = TAIL = 1 << 20
BLOCK = 4 << 10
STRIDE = 1 << 20


@dataclass(frozen=True, slots=True)
class ContentFingerprint:
    """A checkpoint's files as they were when marked; a few fixed-size fields."""

    scheme: str
    files: int
    bytes: int
    content: str
    identity: str

    @classmethod
    def from_dict(cls, value: Any) -> ContentFingerprint:
        """A sidecar's fingerprint, its types checked (raises TypeError)."""
        if not isinstance(value, Mapping):
            raise TypeError("the content fingerprint is not a mapping")
        fields = {name: value.get(name) for name in ("scheme", "content", "identity")}
        counts = {name: value.get(name) for name in ("files", "bytes")}
        if not all(isinstance(v, str) and len(v) <= 128 for v in fields.values()):
            raise TypeError("bad content fingerprint")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                   for v in counts.values()):
            raise TypeError("bad content fingerprint counts")
        return cls(scheme=str(fields["scheme"]), files=int(counts["files"] or 0),
                   bytes=int(counts["bytes"] or 0), content=str(fields["content"]),
                   identity=str(fields["identity"]))


def members(checkpoint: Path, own: Callable[[str], bool]) -> list[tuple[str, Path]]:
    """(relative path, path) of each file of a checkpoint, sorted: the file itself, or a folder's
    files (its subfolders walked without following symlinks; `own` names the files left out)."""
    try:
        is_dir = stat.S_ISDIR(os.stat(checkpoint).st_mode)
    except OSError:
        is_dir = False
    if not is_dir:
        return [(checkpoint.name, checkpoint)]
    found: list[tuple[str, Path]] = []
    for root, _, files in os.walk(checkpoint):  # unreadable folders are left out, not raised
        for name in files:
            if not own(name):
                path = Path(root) / name
                found.append((path.relative_to(checkpoint).as_posix(), path))
    return sorted(found)


def take(checkpoint: Path, own: Callable[[str], bool]) -> ContentFingerprint:
    """The fingerprint of a checkpoint's files now."""
    files = members(checkpoint, own)
    content, total = _content(files)
    return ContentFingerprint(scheme=SCHEME, files=len(files), bytes=total, content=content,
                              identity=_identity(files))


def differs(checkpoint: Path, recorded: ContentFingerprint,
            own: Callable[[str], bool]) -> str | None:
    """What differs between a checkpoint and its recorded fingerprint; None when it is the one
    marked (its files untouched, or their sampled content the same)."""
    if recorded.scheme != SCHEME:
        return f"its fingerprint ({recorded.scheme}) is not one this version can check"
    files = members(checkpoint, own)
    if _identity(files) == recorded.identity:
        return None
    content, total = _content(files)
    if content == recorded.content:
        return None
    if (len(files), total) != (recorded.files, recorded.bytes):
        return (f"its files changed after this sidecar ({recorded.files} files, "
                f"{recorded.bytes} bytes when marked; {len(files)} files, {total} bytes now)")
    return "its content changed after this sidecar (the same files and sizes, other bytes)"


def _identity(files: list[tuple[str, Path]]) -> str:
    digest = hashlib.sha256()
    for name, path in files:
        try:
            info = os.stat(path)
            token = (f"{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}:"
                     f"{info.st_ctime_ns}")
        except OSError as exc:
            token = f"error:{_errname(exc)}"
        digest.update(f"{name}\0{token}\0".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def _content(files: list[tuple[str, Path]]) -> tuple[str, int]:
    digest = hashlib.sha256()
    total = 0
    for name, path in files:
        digest.update(f"{name}\0".encode("utf-8", "surrogateescape"))
        total += _sample(path, digest)
    return digest.hexdigest(), total


def _sample(path: Path, digest: Any) -> int:
    """Feed a file's size and sampled bytes to `digest`; its size (0 when it is not a readable
    regular file: a token says what it is instead)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        digest.update(f"error:{_errname(exc)}\0".encode())
        return 0
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block, /dev/zero never ends
            digest.update(f"not-regular:{stat.S_IFMT(info.st_mode)}\0".encode())
            return 0
        size = info.st_size
        digest.update(f"{size}\0".encode())
        for offset, length in _blocks(size):
            digest.update(os.pread(fd, length, offset))
        return size
    except OSError as exc:
        digest.update(f"error:{_errname(exc)}\0".encode())
        return 0
    finally:
        os.close(fd)


def _blocks(size: int) -> list[tuple[int, int]]:
    """(offset, length) of the bytes read from a file of `size` bytes."""
    if size < WHOLE_BELOW:
        return [(offset, min(HEAD, size - offset)) for offset in range(0, size, HEAD)]
    blocks = [(0, HEAD)]
    blocks += [(offset, BLOCK) for offset in range(HEAD, size - TAIL - BLOCK + 1, STRIDE)]
    return [*blocks, (size - TAIL, TAIL)]


def _errname(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__)
