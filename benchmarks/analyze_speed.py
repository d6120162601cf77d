"""How fast `trainguard analyze` reads big logs, measured side by side in one run.

    python benchmarks/analyze_speed.py [--entries 100000] [--scalars 1000000] [--repeats 3]
        [--names 50000,100000] [--varied 3000] [--parts hf,tensorboard,many]

1. A Hugging Face trainer_state.json of `--entries` log_history entries (loss, grad_norm,
   learning_rate, epoch), analysed by `python -m trainguard analyze FILE --json` in a fresh
   process: whole-process wall time, interpreter start and imports included (the target is
   under 2 s for 100k entries; `analyze` never imports torch).
2. A TensorBoard event file of `--scalars` scalars (four tags, one event per value as
   `torch.utils.tensorboard` writes them), read by trainguard's reader and by TensorBoard's own
   `EventAccumulator` (every scalar kept), one after the other; both must return the same values.
   The target is trainguard's reader at least 4x faster.

3. Logs of many series names (`--names`), each name on a few rows (the loss, the LR and
   `PER_ROW` per-parameter gradient norms of their own on each row, as `grad_norm/<param>` tags
   come when they are logged now and then): a TensorBoard event file, JSON Lines, a Lightning
   metrics.csv (one column per name), a trainer_state.json and a Megatron text log, and an event
   file of `--varied` records all of distinct lengths. Each is analysed by `trainguard analyze
   --json` in a fresh process, its address space capped (`--cap-gb`), and its wall time and peak
   RSS printed. The target: under 10 s and 500 MB for 100k names in about 5 MB, both growing
   with the file, not with rows x names.

The inputs are generated in a temporary directory. The event file's records are framed with the
masked CRC32C of `trainguard.analyze.tensorboard`, cross-checked against TensorBoard's own CRC on
the first records, and TensorBoard's reader then reads the whole file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

TAGS = ("train/loss", "train/grad_norm", "train/learning_rate", "train/loss_scale")


def trainer_state(path: Path, entries: int) -> None:
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.05, entries)
    history = [{"epoch": round(i / entries * 3, 4), "grad_norm": float(1.0 + abs(noise[i])),
                "learning_rate": 2e-5 * min(1.0, i / 1000), "loss": 2.5 * math.exp(-i / entries)
                + 0.3 + float(noise[i]), "step": 10 * (i + 1)} for i in range(entries)]
    history.insert(entries // 2, {"eval_loss": 1.2, "epoch": 1.5, "step": 10 * entries // 2})
    path.write_text(json.dumps({"global_step": 10 * entries, "logging_steps": 10,
                                "log_history": history}))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _event(step: int, tag: bytes, value: float) -> bytes:
    """An `Event{wall_time, step, summary{value{tag, simple_value}}}`, as protobuf bytes."""
    inner = b"\x0a" + _varint(len(tag)) + tag + b"\x15" + struct.pack("<f", value)
    summary = b"\x0a" + _varint(len(inner)) + inner
    return (b"\x09" + struct.pack("<d", 1.7e9 + step) + b"\x10" + _varint(step)
            + b"\x2a" + _varint(len(summary)) + summary)


def event_file(path: Path, scalars: int) -> None:
    steps = scalars // len(TAGS)
    values = {TAGS[0]: 2.0 + np.sin(np.arange(steps) / 50.0), TAGS[1]: np.ones(steps),
              TAGS[2]: np.full(steps, 2e-5), TAGS[3]: np.full(steps, 65536.0)}
    values[TAGS[0]][steps // 3] = math.nan  # a NaN step, as a scalar
    write_events(path, ((step, tag, float(values[tag][step])) for step in range(steps)
                        for tag in TAGS))


def write_events(path: Path, scalars: Iterable[tuple[int, str, float]]) -> None:
    """An event file of one `Event` per (step, tag, value), framed as TFRecords."""
    from trainguard.analyze.tensorboard import masked_crc32c

    # the first record of every event file: Event{wall_time, file_version}
    payloads = [b"\x09" + struct.pack("<d", 1.7e9) + b"\x1a\x0dbrain.Event:2"]
    payloads.extend(_event(step, tag.encode(), value) for step, tag, value in scalars)
    lengths = np.array([len(p) for p in payloads], dtype=np.int64)
    heads = [struct.pack("<Q", n) for n in lengths]
    framing = np.frombuffer(b"".join(heads), dtype=np.uint8)
    head_crc = masked_crc32c(framing, np.arange(len(heads), dtype=np.int64) * 8,
                             np.full(len(heads), 8, dtype=np.int64))
    body = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    body_crc = masked_crc32c(body, starts, lengths)
    try:
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as reference
    except ImportError:  # the many-series cases run without TensorBoard installed
        reference = None
    for k in range(3 if reference is not None else 0):
        assert int(head_crc[k]) == reference(heads[k]) and int(body_crc[k]) == reference(
            payloads[k]), "the framing's CRC differs from TensorBoard's"
    with path.open("wb") as out:
        for k, payload in enumerate(payloads):
            out.write(heads[k] + struct.pack("<I", int(head_crc[k])) + payload
                      + struct.pack("<I", int(body_crc[k])))


# -- many series: each name logged on a few rows only (per-parameter gradient norms) ----------
PER_ROW = 8
"""Parameter series per logged row: `N` names make N / PER_ROW rows, each holding the loss, the
learning rate and PER_ROW names of their own, the shape where a dense rows x names table of
values grows with the square of the file."""


def _param(j: int) -> str:
    return f"grad_norm/p{j}"


def _sparse_rows(names: int) -> Iterable[tuple[int, dict[str, float]]]:
    rng = np.random.default_rng(1)
    values = rng.uniform(0.5, 1.5, names).tolist()
    for row in range(names // PER_ROW):
        record = {"loss": 2.0 + math.sin(row / 50.0), "lr": 1e-4}
        for j in range(row * PER_ROW, (row + 1) * PER_ROW):
            record[_param(j)] = values[j]
        yield row, record


def many_tensorboard(path: Path, names: int) -> None:
    write_events(path, ((row, tag, value) for row, record in _sparse_rows(names)
                        for tag, value in record.items()))


def varied_tensorboard(path: Path, records: int) -> None:
    """Records of `records` distinct lengths (tags of 1 to `records` characters): the CRC check
    cannot batch records of one length."""
    write_events(path, ((k, "t" * (k + 1), 1.0) for k in range(records)))


def many_jsonl(path: Path, names: int) -> None:
    with path.open("w") as out:
        for row, record in _sparse_rows(names):
            out.write(json.dumps({"step": row, **record}) + "\n")


def many_hf(path: Path, names: int) -> None:
    history = [{"step": row, "epoch": row / 1000, **record} for row, record in _sparse_rows(names)]
    path.write_text(json.dumps({"global_step": len(history), "log_history": history}))


def many_csv(path: Path, names: int, rows: int = 40) -> None:
    """A Lightning metrics.csv of `names` columns: each line fills the step, the loss and
    names / rows columns of its own (a CSV holds every column on every line, filled or not)."""
    per_line = max(1, names // rows)
    header = ["step", "epoch", "train_loss_step"] + [_param(j) for j in range(names)]
    with path.open("w") as out:
        out.write(",".join(header) + "\n")
        for row in range(rows):
            fields = [""] * len(header)
            fields[0], fields[1], fields[2] = str(row), "0", f"{2.0 + math.sin(row / 5):.6f}"
            for j in range(row * per_line, min(names, (row + 1) * per_line)):
                fields[3 + j] = f"{1.0 + j % 7 / 10:.4f}"
            out.write(",".join(fields) + "\n")


def many_text(path: Path, names: int) -> None:
    """Megatron-LM lines (every `key: value` between bars is read)."""
    with path.open("w") as out:
        for row, record in _sparse_rows(names):
            pairs = " | ".join(f"{'lm loss' if k == 'loss' else k}: {v:.6E}"
                               for k, v in record.items())
            out.write(f" iteration {row + 1:8d}/  100000 | {pairs} |\n")


MANY: dict[str, tuple[str, Callable[[Path, int], None]]] = {
    "tensorboard": ("events.out.tfevents.1700000000.host.1.0", many_tensorboard),
    "jsonl": ("metrics.jsonl", many_jsonl),
    "csv": ("metrics.csv", many_csv),
    "hf": ("trainer_state.json", many_hf),
    "text": ("train.log", many_text),
}


_LAUNCHER = """
import os, resource, sys
cap, report, program = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
pid = os.fork()
if pid == 0:
    os.execv(program[0], program)
_, status, usage = os.wait4(pid, 0)
with open(report, "w") as out:
    out.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""
"""Runs a command and writes its peak RSS (KB). A child's peak RSS counts the memory of the
process it was forked from, so the command is forked from this small launcher, not from the
benchmark (whose own memory would set a floor under every figure)."""


def measured(command: list[str], cap_gb: float, timeout: float) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MB, exit status) of one process, its address space capped at
    `cap_gb` (a run that would need more fails instead of swamping the machine)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "peak"
        started = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(int(cap_gb * 2**30)),
                                  str(report), *command], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            status = child.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            status = child.wait()
        seconds = time.perf_counter() - started
        peak = int(report.read_text()) / 1024 if report.exists() else math.nan
    return seconds, peak, status


def _time(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--scalars", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--names", default="50000,100000",
                        help="series names of the many-series cases, comma-separated")
    parser.add_argument("--varied", type=int, default=3000,
                        help="records of distinct lengths in the varied-length event file")
    parser.add_argument("--formats", default=",".join(MANY),
                        help="formats of the many-series cases, comma-separated")
    parser.add_argument("--cap-gb", type=float, default=4.0,
                        help="address-space cap of each many-series process")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--parts", default="hf,tensorboard,many",
                        help="what to measure, comma-separated: hf, tensorboard, many")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    same = True
    with tempfile.TemporaryDirectory() as tmp:
        if "hf" in parts:
            bench_hf(Path(tmp), args)
        if "tensorboard" in parts:
            same = bench_tensorboard(Path(tmp), args)
        if "many" in parts:
            bench_many(Path(tmp), args)
    return 0 if same else 1


def bench_hf(tmp: Path, args: argparse.Namespace) -> None:
    state = tmp / "trainer_state.json"
    trainer_state(state, args.entries)
    command = [sys.executable, "-m", "trainguard", "analyze", str(state), "--json"]

    def whole_process() -> dict:
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        return json.loads(done.stdout)

    subprocess.run([sys.executable, "-c", "import trainguard"], check=True)  # warm caches
    hf_seconds, result = _time(whole_process, args.repeats)
    startup, _ = _time(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True),
                       args.repeats)
    size = state.stat().st_size / 1e6
    print(f"trainer_state.json: {args.entries:,} entries ({size:.1f} MB), verdict "
          f"{result['verdict']}")  # type: ignore[index]
    print(f"  whole process `trainguard analyze --json`: {hf_seconds:.2f} s (median of "
          f"{args.repeats}; a bare interpreter starts in {startup:.2f} s); target < 2 s: "
          f"{'met' if hf_seconds < 2 else 'NOT met'}")


def bench_tensorboard(tmp: Path, args: argparse.Namespace) -> bool:
    events = tmp / "events.out.tfevents.1700000000.host.1.0"
    event_file(events, args.scalars)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trainguard.analyze.tensorboard import read_scalars

    def ours() -> dict:
        return read_scalars(events)

    def library() -> dict:
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        return {tag: ([e.step for e in accumulator.Scalars(tag)],
                      [e.value for e in accumulator.Scalars(tag)])
                for tag in accumulator.Tags()["scalars"]}

    ours_s, mine = _time(ours, args.repeats)
    lib_s, theirs = _time(library, 1)
    same = _same(mine, theirs)
    print(f"event file: {args.scalars:,} scalars ({events.stat().st_size / 1e6:.1f} MB)")
    print(f"  trainguard reader  {ours_s:6.2f} s (median of {args.repeats})")
    print(f"  EventAccumulator   {lib_s:6.2f} s (one run; "
          f"{lib_s / args.scalars * 200_000:.2f} s per 200k scalars)")
    print(f"  ratio              {lib_s / ours_s:6.1f}x faster; target >= 4x: "
          f"{'met' if lib_s / ours_s >= 4 else 'NOT met'}; same values: {same}")
    events.unlink()
    return same


def bench_many(tmp: Path, args: argparse.Namespace) -> None:
    """`trainguard analyze --json` on logs of many series names, one fresh process each: its wall
    time and peak RSS (the target: under 10 s and 500 MB for 100k names in about 5 MB)."""
    cases: list[tuple[str, int, Path]] = []
    for fmt in args.formats.split(","):
        name, write = MANY[fmt]
        for names in (int(n) for n in args.names.split(",")):
            folder = tmp / f"{fmt}-{names}"
            folder.mkdir()
            write(folder / name, names)
            cases.append((fmt, names, folder / name))
    if "tensorboard" in args.formats.split(",") and args.varied:
        folder = tmp / "varied"
        folder.mkdir()
        varied_tensorboard(folder / MANY["tensorboard"][0], args.varied)
        cases.append(("tensorboard, distinct record lengths", args.varied,
                      folder / MANY["tensorboard"][0]))
    print(f"many series names (`trainguard analyze --json`, one process each, capped at "
          f"{args.cap_gb:g} GB of address space, {args.timeout:g} s):")
    for fmt, names, path in cases:
        command = [sys.executable, "-m", "trainguard", "analyze", str(path), "--json"]
        seconds, peak, status = measured(command, args.cap_gb, args.timeout)
        what = "records" if "lengths" in fmt else "names"
        outcome = "ok" if status == 0 else f"FAILED (exit {status})"
        print(f"  {fmt:38s} {names:>7,} {what} {path.stat().st_size / 1e6:6.2f} MB  "
              f"{seconds:7.2f} s  {peak:8.0f} MB peak RSS  {outcome}")


def _same(mine: dict, theirs: dict) -> bool:
    if set(_decoded(mine)) != set(theirs):
        return False
    for tag, (steps, values) in theirs.items():
        our_steps, our_values = _decoded(mine)[tag]
        if list(our_steps) != list(steps):
            return False
        a, b = np.asarray(our_values, dtype=np.float32), np.asarray(values, dtype=np.float32)
        if not np.array_equal(a, b, equal_nan=True):
            return False
    return True


def _decoded(tags: dict) -> dict:
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in tags.items()}


if __name__ == "__main__":
    sys.exit(main())
