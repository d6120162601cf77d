"""TensorBoard event files (`events.out.tfevents.*`) and run directories, read directly.

An event file is a TFRecord stream: per record an 8-byte little-endian length, the masked CRC32C
of those 8 bytes, the payload (one `Event` protocol buffer) and the masked CRC32C of the payload.
This reader walks the records and decodes, with a minimal protobuf wire-format parser, only what
a scalar needs: `Event.step` (field 2) and, in `Event.summary` (field 5), each `Summary.Value`'s
`tag` (1) and either its `simple_value` (2, what `torch.utils.tensorboard` and the HF Trainer
write) or a numeric `tensor` (8) holding a single element (what `tf.summary.scalar` writes).
Everything else (graphs, histograms, images, text, run metadata) is skipped by its wire type
without being decoded. It needs neither TensorBoard nor protobuf installed.

Checks. Every record's length CRC is verified (it guards the framing: a wrong length would
misread every record after it), and so is the payload CRC of every record a value is taken from.
Payloads of records that yield nothing (a graph, an image) are skipped unverified: nothing of
theirs is used. The CRCs are computed for all records at once with NumPy (CRC32C, Castagnoli),
one vector operation per byte position of 32-byte chunks cut from every record, whatever the
mix of record lengths, which is what makes checking them affordable. A file
that ends inside a record (a writer still writing, or killed) is read up to its last complete
record, with a note; a CRC mismatch or a record that does not parse is an error naming the file
and the byte offset. A record that runs past the end of the file is a cut-off only when its
length passes its CRC check: a damaged length field (one that points beyond the file from its
middle) would otherwise pass for a writer killed there, and every record after it go unread.

A run directory holds one run: its event files (several when the run was restarted) are read in
name order (their names start with the creation time). Event files in subdirectories named like
an evaluation (`validation`, `val`, `eval`, `test`: the Keras layout) are that run's
evaluations; a directory holding several runs in other subdirectories is an error that lists them.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from trainguard.analyze import windows
from trainguard.analyze.log import (
    LOSS,
    WINDOW_RULES,
    Log,
    LogError,
    Series,
    _classify,
    choose_loss,
    choose_lr,
    is_eval_name,
    is_train_loss,
)
from trainguard.analyze.source import open_regular

FORMAT = "tensorboard"
EVAL_DIRS = frozenset({"validation", "val", "valid", "eval", "evaluation", "test"})

_U64 = struct.Struct("<Q").unpack_from
_F32 = struct.Struct("<f").unpack_from
_F64 = struct.Struct("<d").unpack_from
_I64 = struct.Struct("<q").unpack_from

# TensorProto dtypes (tensorflow/core/framework/types.proto) this reader decodes, and how
_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64, _DT_HALF, _DT_BFLOAT16 = 1, 2, 3, 9, 19, 14
_NUMERIC_DTYPES = frozenset({_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64, _DT_HALF,
                             _DT_BFLOAT16})


def is_event_file(path: Path) -> bool:
    return "tfevents" in path.name and not path.name.endswith(".profile-empty")


def event_files(path: Path) -> tuple[list[Path], list[Path]]:
    """(training files, evaluation files) of a run directory or a single event file."""
    if path.is_file():
        return [path], []
    if not path.is_dir():
        raise LogError(f"{path}: no such file or directory")
    found = sorted(p for p in path.rglob("*") if p.is_file() and is_event_file(p))
    if not found:
        raise LogError(f"{path}: no TensorBoard event files (events.out.tfevents.*) in it")
    train: list[Path] = []
    evals: list[Path] = []
    runs: set[Path] = set()
    for file in found:
        parent = file.parent
        if parent != path and parent.name.lower() in EVAL_DIRS:
            evals.append(file)
            parent = parent.parent
        else:
            train.append(file)
        if parent.name.lower() == "train" and parent != path:
            parent = parent.parent
        runs.add(parent)
    if len(runs) > 1:
        names = ", ".join(sorted(str(r.relative_to(path)) or "." for r in runs)[:6])
        raise LogError(f"{path}: holds {len(runs)} TensorBoard runs ({names}); pass one of them")
    return train, evals


def read(path: str | Path) -> Log:
    path = Path(path)
    train_files, eval_files = event_files(path)
    tags: dict[str, tuple[array[int], array[float]]] = {}
    notes: list[str] = []
    for file in train_files + eval_files:
        training = file in train_files
        for tag, (steps, values) in read_scalars(file, notes).items():
            name = tag if training or is_eval_name(tag) else f"eval/{tag}"
            into = tags.setdefault(name, (array("q"), array("d")))
            into[0].extend(steps)
            into[1].extend(values)
    return _build(path, tags, notes)


Points = tuple[Sequence[int], Sequence[float]]


def _build(path: Path, tags: Mapping[str, Points], notes: list[str]) -> Log:
    train: dict[str, Points] = {}
    evals: dict[str, Points] = {}
    for tag, (steps, values) in tags.items():
        kind, name = _classify(tag)
        if kind == 0 or not steps:
            continue
        target = train if kind == 1 else evals
        if name in target:  # two tags meaning the same series: the first one wins
            continue
        target[name] = (steps, values)
    if not train:
        listed = ", ".join(list(tags)[:8])
        what = "scalars" if not tags else f"training scalars (its tags: {listed})"
        raise LogError(f"{path}: no {what} in the TensorBoard events")
    all_steps, series, labels, stride = _series(train, notes)
    loss_from = choose_loss(series, notes)
    choose_lr(series, notes)
    by_step: dict[int, dict[str, float]] = {}
    for name, (eval_steps, eval_values) in evals.items():
        for step, value in zip(eval_steps, eval_values, strict=True):
            by_step.setdefault(step, {})[name] = value
    if len(by_step) >= 2 * windows.MAX_EVALS:
        while len(by_step) >= 2 * windows.MAX_EVALS:
            by_step = windows.halve_evals(by_step)
        notes.append(windows.EVALS_NOTE)
    return Log(path=str(path), format=FORMAT, steps=all_steps, series=series, labels=labels,
               evals=sorted(by_step.items()), notes=notes, row_span=stride,
               loss_from=loss_from)


def _series(train: dict[str, Points], notes: list[str],
            ) -> tuple[list[int], Series, list[str] | None, int]:
    """The rows (every step any series holds, ascending) and each series' points, for all
    series at once: a run of 100k tags is a few array operations, not 100k of them. Past
    `windows.MAX_ROWS` * 2 rows, the rows are summed up in windows (`_windowed`), named by the
    rows they hold; the last value returned is how many rows a window holds (1: none)."""
    sizes = np.fromiter((len(steps) for steps, _ in train.values()), dtype=np.int64,
                        count=len(train))
    steps = np.concatenate([np.asarray(s, dtype=np.int64) for s, _ in train.values()])
    values = np.concatenate([np.asarray(v, dtype=np.float64) for _, v in train.values()])
    for held in train.values():  # the reader's own arrays, copied: not held twice
        for column in held:
            if isinstance(column, array):
                del column[:]
    owner = np.repeat(np.arange(len(train), dtype=np.int32), sizes)
    # np.unique hashes (NumPy 2): a stable sort merges the tags' ascending runs far faster
    ordered = np.sort(steps, kind="stable")
    all_steps = ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]
    del ordered
    rows = np.searchsorted(all_steps, steps)
    del steps
    later = np.diff(rows) > 0
    same_owner = owner[1:] == owner[:-1]
    if np.any(same_owner & ~later):  # a tag whose steps go back or repeat: order its rows
        order = np.lexsort((rows, owner))  # stable: a step written twice keeps its file order
        rows, owner, values = rows[order], owner[order], values[order]
        last = np.ones(rows.size, dtype=bool)  # a step written twice: the last
        last[:-1] = (rows[1:] != rows[:-1]) | (owner[1:] != owner[:-1])
        rows, owner, values = rows[last], owner[last], values[last]
    bounds = np.searchsorted(owner, np.arange(len(train) + 1, dtype=np.int32)).tolist()
    del owner
    labels: list[str] | None = None
    stride = 1
    if all_steps.size >= 2 * windows.MAX_ROWS:
        total = all_steps.size
        all_steps, rows, values, bounds, labels, stride = _windowed(
            all_steps, rows, values, bounds, list(train))
        notes.append(windows.note(total, stride))
    row_list, value_list = rows.tolist(), values.tolist()
    series = Series(all_steps.size)
    for k, name in enumerate(train):
        start, stop = bounds[k], bounds[k + 1]
        series.set_points(name, row_list[start:stop], value_list[start:stop])
    return all_steps.tolist(), series, labels, stride


def _windowed(all_steps: np.ndarray, rows: np.ndarray, values: np.ndarray, bounds: list[int],
              names: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int],
                                         list[str], int]:
    """The rows in windows of `stride` consecutive rows (the fewest, a power of two, that
    leave fewer than `windows.MAX_ROWS` * 2), each series summed up by its rule in
    `WINDOW_RULES` as a reader's `LogBuilder` sums them: (the windows' steps, each point's
    window, the points' values, the series' bounds, the windows' names, stride)."""
    total = all_steps.size
    stride = 2
    while -(-total // stride) >= 2 * windows.MAX_ROWS:
        stride *= 2
    count = -(-total // stride)
    window = rows // stride
    first = all_steps[::stride]
    last = all_steps[np.minimum(np.arange(1, count + 1) * stride, total) - 1]
    step = last.copy()
    loss = LOSS if LOSS in names else next((n for n in names if is_train_loss(n)), None)
    kept_rows: list[np.ndarray] = []
    kept_values: list[np.ndarray] = []
    kept_bounds = [0]
    for k, name in enumerate(names):
        held, value = window[bounds[k]:bounds[k + 1]], values[bounds[k]:bounds[k + 1]]
        starts = np.flatnonzero(np.concatenate(([True], held[1:] != held[:-1])))
        if held.size == 0:
            starts = starts[:0]
        rule = WINDOW_RULES.get(name, windows.MEAN)
        if not starts.size:
            summed = value[:0]
        elif rule == windows.LAST:
            summed = value[np.append(starts[1:], held.size) - 1]
        elif rule == windows.LARGEST:  # NaN wins: np.maximum propagates it
            summed = np.maximum.reduceat(value, starts)
        elif rule == windows.SMALLEST:
            summed = np.minimum.reduceat(value, starts)
        else:  # the mean: a NaN or inf among the values is the window's
            summed = np.add.reduceat(value, starts) / np.diff(np.append(starts, held.size))
        if name == loss:  # a window holding a non-finite loss: the step of its first
            bad = np.flatnonzero(~np.isfinite(value))
            if bad.size:
                hit = held[bad]
                firsts = np.concatenate(([True], hit[1:] != hit[:-1]))
                step[hit[firsts]] = all_steps[rows[bounds[k]:bounds[k + 1]][bad[firsts]]]
        kept_rows.append(held[starts])
        kept_values.append(summed)
        kept_bounds.append(kept_bounds[-1] + starts.size)
    labels = [f"step {a}" if a == b else f"step {a} to step {b}"
              for a, b in zip(first.tolist(), last.tolist(), strict=True)]
    return (step, np.concatenate(kept_rows), np.concatenate(kept_values), kept_bounds, labels,
            stride)


_PIECE = 1 << 20
"""Bytes of an event file read at a time (a record longer than that is read whole): the CRC
arrays and offset lists of a piece take some 6 times its size."""


def read_scalars(file: Path, notes: list[str] | None = None,
                 ) -> dict[str, tuple[Sequence[int], Sequence[float]]]:
    """Every scalar of one event file: tag -> (steps, values), in file order. The file is read
    a piece at a time, each piece's records checked before the next is read; the scalars are
    kept as arrays of 64-bit numbers."""
    out: dict[bytes, tuple[array[int], array[float]]] = {}
    templates: dict[bytes, tuple[array[int], array[float]]] = {}
    """A summary holding one `simple_value` is the same bytes as the last one of its tag, but
    for the 4 bytes of the float at its end: those bytes, parsed once, name the tag."""
    records = 0
    base = 0  # the file offset of buf[0]
    buf = b""
    truncated = False
    try:
        with open_regular(file) as handle:
            while True:
                piece = handle.read(_PIECE)
                if not piece and not buf:
                    break
                buf = buf + piece if buf else piece
                done, need = _read_records(file, buf, base, out, templates)
                records += done
                if need is None:  # all of buf read
                    base += len(buf)
                    buf = b""
                    continue
                if not piece:  # the file ends inside a record
                    truncated = True
                    break
                base += need
                buf = buf[need:]
    except OSError as exc:
        raise LogError(f"{file}: cannot be read ({exc.strerror or exc})") from None
    if not records and not truncated:
        if notes is not None:
            notes.append(f"{file.name} is empty")
        return {}
    if truncated:
        if not records:
            raise LogError(f"{file}: not a TensorBoard event file (no complete record)")
        if notes is not None:
            notes.append(f"{file.name} ends inside a record (the writer was still writing or was "
                         f"killed); its {records} complete records are read")
    return {tag.decode("utf-8", "replace"): pair for tag, pair in out.items()}


def _read_records(file: Path, buf: bytes, base: int,
                  out: dict[bytes, tuple[array[int], array[float]]],
                  templates: dict[bytes, tuple[array[int], array[float]]],
                  ) -> tuple[int, int | None]:
    """Read the whole records of `buf` (at file offset `base`) into `out` and check their CRCs:
    how many, and where the first record not whole in `buf` starts (None: none)."""
    heads: list[int] = []
    used: list[int] = []  # payload offsets and lengths of records that gave values
    used_len: list[int] = []
    size = len(buf)
    pos = 0
    need: int | None = None
    f32 = _F32
    try:
        while pos < size:
            if pos + 12 > size:
                need = pos
                break
            length = _U64(buf, pos)[0]
            start = pos + 12
            end = start + length
            if end + 4 > size:  # a cut-off only if its length is what the writer wrote
                _check_heads(file, buf, [*heads, pos], base)
                need = pos
                break
            heads.append(pos)
            pos = end + 4
            # the fast path: wall_time, step, a summary of one simple_value already seen
            if length > 14 and buf[start] == 0x09 and buf[start + 9] == 0x10:
                i = start + 10
                step = buf[i]
                i += 1
                if step >= 0x80:
                    step, i = _varint_rest(buf, i, step)
                    if step >= 1 << 63:
                        step -= 1 << 64
                if buf[i] == 0x2A and buf[i + 1] + i + 2 == end:
                    pair = templates.get(buf[i + 2:end - 4])
                    if pair is not None:
                        pair[0].append(step)
                        pair[1].append(f32(buf, end - 4)[0])
                        used.append(start)
                        used_len.append(length)
                        continue
            if _event(buf, start, end, out, templates):
                used.append(start)
                used_len.append(length)
    except (IndexError, ValueError, struct.error, OverflowError) as exc:
        _check_heads(file, buf, heads, base)  # a damaged length reads as a parse failure
        at = base + (heads[-1] if heads else pos)
        raise LogError(f"{file}: the record at byte {at} does not parse as a TensorBoard event "
                       f"({exc}); the file is damaged") from None
    _check_heads(file, buf, heads, base)
    _check_payloads(file, buf, np.asarray(used, dtype=np.int64),
                    np.asarray(used_len, dtype=np.int64), base)
    return len(heads), need


def _event(buf: bytes, i: int, end: int, out: dict[bytes, tuple[array[int], array[float]]],
           templates: dict[bytes, tuple[array[int], array[float]]]) -> bool:
    """Decode one Event's scalars into `out`; True when it held any. A summary of exactly one
    value made of a tag and a `simple_value` becomes a template for the fast path."""
    step = 0
    summary: tuple[int, int] | None = None
    while i < end:
        key = buf[i]
        i += 1
        if key == 0x09:  # wall_time, double
            i += 8
        elif key == 0x10:  # step, varint
            step = buf[i]
            i += 1
            if step >= 0x80:
                step, i = _varint_rest(buf, i, step)
            if step >= 1 << 63:
                step -= 1 << 64
        elif key == 0x2A:  # summary
            length = buf[i]
            i += 1
            if length >= 0x80:
                length, i = _varint_rest(buf, i, length)
            summary = (i, i + length)
            i += length
        else:
            i = _skip(buf, i, key)
    if i != end:
        raise ValueError("a field runs past the end of the record")
    if summary is None:
        return False
    found = False
    j, stop = summary
    while j < stop:
        key = buf[j]
        j += 1
        if key != 0x0A:  # Summary.value is field 1; nothing else is defined
            j = _skip(buf, j, key)
            continue
        length = buf[j]
        j += 1
        if length >= 0x80:
            length, j = _varint_rest(buf, j, length)
        value_end = j + length
        tag, value = _value(buf, j, value_end)
        j = value_end
        if tag is not None and value is not None:
            pair = out.get(tag)
            if pair is None:
                pair = out[tag] = (array("q"), array("d"))
            pair[0].append(step)
            pair[1].append(value)
            found = True
            # the template: `0a len 0a taglen tag 15` with the float's 4 bytes last, nothing else
            head = summary[0]
            if (value_end == stop and buf[stop - 5] == 0x15 and length < 0x80
                    and head + 5 + len(tag) == stop - 4 and buf[head + 2] == 0x0A
                    and len(tag) < 0x80):
                templates[buf[head:stop - 4]] = pair
    if j != stop:
        raise ValueError("a summary value runs past the end of the summary")
    return found


def _value(buf: bytes, i: int, end: int) -> tuple[bytes | None, float | None]:
    """(tag, scalar) of one Summary.Value; scalar None when it holds no scalar."""
    tag: bytes | None = None
    value: float | None = None
    while i < end:
        key = buf[i]
        i += 1
        if key == 0x0A:  # tag
            length = buf[i]
            i += 1
            if length >= 0x80:
                length, i = _varint_rest(buf, i, length)
            tag = buf[i:i + length]
            i += length
        elif key == 0x15:  # simple_value, float
            value = _F32(buf, i)[0]
            i += 4
        elif key == 0x42:  # tensor
            length = buf[i]
            i += 1
            if length >= 0x80:
                length, i = _varint_rest(buf, i, length)
            value = _tensor_scalar(buf, i, i + length)
            i += length
        else:
            i = _skip(buf, i, key)
    return tag, value


def _tensor_scalar(buf: bytes, i: int, end: int) -> float | None:
    """The value of a numeric TensorProto holding exactly one element, else None."""
    dtype = 0
    elements = 1
    content: bytes | None = None
    values: list[float] = []
    while i < end:
        key = buf[i]
        i += 1
        field, wire = key >> 3, key & 7
        if key >= 0x80:
            key, i = _varint_rest(buf, i, key)
            field, wire = key >> 3, key & 7
        if field == 1 and wire == 0:
            dtype, i = _varint(buf, i)
        elif field == 2 and wire == 2:  # tensor_shape: the product of its dims
            length, i = _varint(buf, i)
            elements = _shape_elements(buf, i, i + length)
            i += length
        elif field == 4 and wire == 2:
            length, i = _varint(buf, i)
            content = buf[i:i + length]
            i += length
        elif field in (5, 6, 7, 10, 13) and wire == 2:  # packed repeated values
            length, i = _varint(buf, i)
            values.extend(_packed(buf, i, i + length, field))
            i += length
        elif field == 5 and wire == 5:
            values.append(_F32(buf, i)[0])
            i += 4
        elif field == 6 and wire == 1:
            values.append(_F64(buf, i)[0])
            i += 8
        elif field in (7, 10, 13) and wire == 0:
            raw, i = _varint(buf, i)
            values.append(float(_signed(raw)))
        else:
            i = _skip_field(buf, i, wire)
    if dtype not in _NUMERIC_DTYPES or elements != 1:
        return None
    if content is not None:
        width = {_DT_FLOAT: "<f", _DT_DOUBLE: "<d", _DT_INT32: "<i", _DT_INT64: "<q",
                 _DT_HALF: "<e"}.get(dtype)
        if width is None or len(content) != struct.calcsize(width):
            return None
        return float(struct.unpack(width, content)[0])
    if len(values) != 1:
        return None
    if dtype == _DT_HALF:  # half_val holds the float16 bits in an int
        return float(np.array([int(values[0])], dtype=np.uint16).view(np.float16)[0])
    return values[0]


def _shape_elements(buf: bytes, i: int, end: int) -> int:
    elements = 1
    while i < end:
        key, i = _varint(buf, i)
        if key == 0x12:  # dim
            length, i = _varint(buf, i)
            stop = i + length
            size = 1
            while i < stop:
                inner, i = _varint(buf, i)
                if inner == 0x08:
                    size, i = _varint(buf, i)
                    size = _signed(size)
                else:
                    i = _skip_field(buf, i, inner & 7)
            elements *= size
        else:
            i = _skip_field(buf, i, key & 7)
    return elements


def _packed(buf: bytes, i: int, end: int, field: int) -> list[float]:
    if field == 5:
        return [v for (v,) in struct.iter_unpack("<f", buf[i:end])]
    if field == 6:
        return [v for (v,) in struct.iter_unpack("<d", buf[i:end])]
    out: list[float] = []
    while i < end:
        raw, i = _varint(buf, i)
        out.append(float(_signed(raw)))
    return out


def _signed(raw: int) -> int:
    return raw - (1 << 64) if raw >= 1 << 63 else raw


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    first = buf[i]
    i += 1
    if first < 0x80:
        return first, i
    return _varint_rest(buf, i, first)


def _varint_rest(buf: bytes, i: int, first: int) -> tuple[int, int]:
    value = first & 0x7F
    shift = 7
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")


def _skip(buf: bytes, i: int, key: int) -> int:
    """Skip the field whose key's first byte was `key` (the rest of a long key included)."""
    if key >= 0x80:
        key, i = _varint_rest(buf, i, key)
    return _skip_field(buf, i, key & 7)


def _skip_field(buf: bytes, i: int, wire: int) -> int:
    if wire == 0:
        while buf[i] >= 0x80:
            i += 1
        return i + 1
    if wire == 1:
        return i + 8
    if wire == 2:
        length, i = _varint(buf, i)
        return i + length
    if wire == 5:
        return i + 4
    raise ValueError(f"wire type {wire} (groups are not used by TensorBoard events)")


# -- CRC32C (Castagnoli), vectorised over records -----------------------------------------------
def _crc_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1)
    return table.astype(np.uint32)


_TABLE = _crc_table()
_MASK_DELTA = np.uint32(0xA282EAD8)


_CHUNK = 32
"""Bytes of a record hashed per vector step: records are cut into chunks of this many bytes,
all chunks of all records hashed together, and each record's chunks then combined."""


def masked_crc32c(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The TFRecord masked CRC32C of `data[starts[k] : starts[k] + lengths[k]]` for every k.

    Records of any mix of lengths cost the same per byte: each record is cut into chunks of
    `_CHUNK` bytes (its first chunk padded in front with zeros, which leave a CRC register of 0
    at 0), the chunks of every record are hashed together, one vector operation per byte
    position, and a record's CRC is the XOR of its chunks' CRCs, each carried through the zero
    bytes after it (CRC is linear over GF(2): `_carry`). The initial register of the CRC is
    put in where a record's first byte is hashed."""
    out = np.empty(starts.size, dtype=np.uint32)
    if starts.size == 0:
        return out
    lengths = lengths.astype(np.int64)
    width = int(min(_CHUNK, max(int(lengths.max()), 1)))
    chunks = np.maximum((lengths + width - 1) // width, 1)
    pad = chunks * width - lengths  # zeros in front of the first chunk
    first = np.cumsum(chunks) - chunks  # each record's first chunk
    record = np.repeat(np.arange(starts.size), chunks)
    place = np.arange(record.size, dtype=np.int64) - first[record]  # a chunk's place in its record
    origin = starts.astype(np.int64)[record] - pad[record] + width * place
    by_pad = first[np.argsort(pad, kind="stable")]  # first chunks, by their padding
    pad_bounds = np.searchsorted(np.sort(pad), np.arange(width + 1))
    register = np.zeros(record.size, dtype=np.uint32)
    byte = np.empty(record.size, dtype=np.uint8)
    low = np.empty(record.size, dtype=np.uint32)
    at = origin
    for column in range(width):  # in place: this loop is the whole cost
        register[by_pad[pad_bounds[column]:pad_bounds[column + 1]]] ^= np.uint32(0xFFFFFFFF)
        data.take(at, out=byte, mode="clip")
        byte[by_pad[pad_bounds[column + 1]:]] = 0  # still padding
        register ^= byte
        np.bitwise_and(register, 0xFF, out=low)
        register >>= np.uint32(8)
        register ^= _TABLE.take(low)
        at += 1
    after = (chunks[record] - 1 - place) * width  # zero bytes a chunk's CRC is carried through
    register = _carry(register, after, width)
    crc = np.bitwise_xor.reduceat(register, first) ^ np.uint32(0xFFFFFFFF)
    crc[lengths == 0] = 0  # the CRC of nothing (no byte took the initial register)
    out[:] = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + _MASK_DELTA
    return out


_CARRIES: dict[int, list[np.ndarray]] = {}
"""Per chunk width, the tables carrying a CRC register through width * 2^k zero bytes."""


def _carry(register: np.ndarray, zeros: np.ndarray, width: int) -> np.ndarray:
    """Each register as it is after `zeros` (a multiple of `width`) zero bytes: a linear map,
    applied as its tables for width * 2^k zero bytes, one per set bit of zeros / width."""
    steps = zeros // width
    tables = _CARRIES.setdefault(width, [])
    bit = 0
    while (steps >> bit).any():
        if bit == len(tables):
            tables.append(_carry_table(width) if bit == 0 else _apply(tables[-1], tables[-1]))
        chosen = np.flatnonzero((steps >> bit) & 1)
        register[chosen] = _apply(tables[bit], register[chosen])
        bit += 1
    return register


def _carry_table(width: int) -> np.ndarray:
    """A (4, 256) table: the register after `width` zero bytes, for each value of each of its
    bytes (the register's other bytes 0): the map is linear, so a register's image is the XOR of
    its four bytes' images."""
    table = (np.arange(256, dtype=np.uint32)[None, :]
             << (np.uint32(8) * np.arange(4, dtype=np.uint32))[:, None])
    for _ in range(width):
        table = _TABLE[table & 0xFF] ^ (table >> np.uint32(8))
    return table


def _apply(table: np.ndarray, register: np.ndarray) -> np.ndarray:
    return (table[0][register & 0xFF] ^ table[1][(register >> np.uint32(8)) & 0xFF]
            ^ table[2][(register >> np.uint32(16)) & 0xFF] ^ table[3][register >> np.uint32(24)])


def _stored(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The little-endian uint32 stored at each offset."""
    raw = data[offsets[:, None] + np.arange(4, dtype=np.int64)].astype(np.uint32)
    return raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16) | (raw[:, 3] << 24)


def _check_heads(file: Path, buf: bytes, heads: list[int], base: int = 0) -> None:
    if not heads:
        return
    data = np.frombuffer(buf, dtype=np.uint8)
    at = np.asarray(heads, dtype=np.int64)
    bad = np.flatnonzero(masked_crc32c(data, at, np.full(at.size, 8, dtype=np.int64))
                         != _stored(data, at + 8))
    if bad.size:
        first = base + int(at[bad[0]])
        what = "not a TensorBoard event file" if first == 0 else "damaged"
        raise LogError(f"{file}: {what} (the record length at byte {first} fails its CRC "
                       "check)")


def _check_payloads(file: Path, buf: bytes, starts: np.ndarray, lengths: np.ndarray,
                    base: int = 0) -> None:
    if not starts.size:
        return
    data = np.frombuffer(buf, dtype=np.uint8)
    bad = np.flatnonzero(masked_crc32c(data, starts, lengths) != _stored(data, starts + lengths))
    if bad.size:
        raise LogError(f"{file}: damaged (the record at byte {base + int(starts[bad[0]]) - 12} "
                       f"fails its CRC check; {bad.size} record(s) in all)")
