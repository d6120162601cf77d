"""How fast `trainguard analyze` reads big logs, measured side by side in one run.

    python benchmarks/analyze_speed.py [--entries 100000] [--scalars 1000000] [--repeats 3]

1. A Hugging Face trainer_state.json of `--entries` log_history entries (loss, grad_norm,
   learning_rate, epoch), analysed by `python -m trainguard analyze FILE --json` in a fresh
   process: whole-process wall time, interpreter start and imports included (the target is
   under 2 s for 100k entries; `analyze` never imports torch).
2. A TensorBoard event file of `--scalars` scalars (four tags, one event per value as
   `torch.utils.tensorboard` writes them), read by trainguard's reader and by TensorBoard's own
   `EventAccumulator` (every scalar kept), one after the other; both must return the same values.
   The target is trainguard's reader at least 4x faster.

The inputs are generated in a temporary directory. The event file's records are framed with the
masked CRC32C of `trainguard.analyze.tensorboard`, cross-checked against TensorBoard's own CRC on
the first records, and TensorBoard's reader then reads the whole file.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import struct
import subprocess
import sys
import tempfile
import time
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
    from trainguard.analyze.tensorboard import masked_crc32c

    steps = scalars // len(TAGS)
    # the first record of every event file: Event{wall_time, file_version}
    payloads = [b"\x09" + struct.pack("<d", 1.7e9) + b"\x1a\x0dbrain.Event:2"]
    values = {TAGS[0]: 2.0 + np.sin(np.arange(steps) / 50.0), TAGS[1]: np.ones(steps),
              TAGS[2]: np.full(steps, 2e-5), TAGS[3]: np.full(steps, 65536.0)}
    values[TAGS[0]][steps // 3] = math.nan  # a NaN step, as a scalar
    for step in range(steps):
        for tag in TAGS:
            payloads.append(_event(step, tag.encode(), float(values[tag][step])))
    lengths = np.array([len(p) for p in payloads], dtype=np.int64)
    heads = [struct.pack("<Q", n) for n in lengths]
    framing = np.frombuffer(b"".join(heads), dtype=np.uint8)
    head_crc = masked_crc32c(framing, np.arange(len(heads), dtype=np.int64) * 8,
                             np.full(len(heads), 8, dtype=np.int64))
    body = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    body_crc = masked_crc32c(body, starts, lengths)
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as reference

    for k in range(3):
        assert int(head_crc[k]) == reference(heads[k]) and int(body_crc[k]) == reference(
            payloads[k]), "the framing's CRC differs from TensorBoard's"
    with path.open("wb") as out:
        for k, payload in enumerate(payloads):
            out.write(heads[k] + struct.pack("<I", int(head_crc[k])) + payload
                      + struct.pack("<I", int(body_crc[k])))


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
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "trainer_state.json"
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

        events = Path(tmp) / "events.out.tfevents.1700000000.host.1.0"
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
    return 0 if same else 1


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
