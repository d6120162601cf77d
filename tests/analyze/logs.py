"""Small training logs written by the tests (never the real logs of the evaluation set)."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np


def trainer_state(path: Path, *, steps: int = 60, every: int = 10, blow_up_at: int | None = None,
                  lr: float = 2e-5) -> Path:
    """A Hugging Face trainer_state.json: a loss falling from 2.5; from `blow_up_at` on the
    loss and gradient norm explode and then go NaN (the Trainer logs NaN as-is in grad_norm)."""
    history = []
    for i in range(1, steps + 1):
        step = i * every
        loss, grad = 2.5 * math.exp(-i / 40) + 0.3, 1.0 + 0.05 * (i % 3)
        if blow_up_at is not None and step >= blow_up_at:
            grown = step - blow_up_at
            loss, grad = (loss * 10 ** (grown // every + 1), grad * 100 ** (grown // every + 1))
            if grown >= 3 * every:
                loss, grad = math.nan, math.nan
        history.append({"epoch": round(i / steps, 4), "grad_norm": grad, "learning_rate": lr,
                        "loss": loss, "step": step})
    state = {"global_step": steps * every, "max_steps": steps * every, "logging_steps": every,
             "log_history": history}
    path.write_text(json.dumps(state, indent=2))  # json writes NaN as NaN, as the Trainer does
    return path


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def scalar_event(step: int, tag: str, value: float) -> bytes:
    """An `Event{wall_time, step, summary{value{tag, simple_value}}}` as protobuf bytes, as
    `torch.utils.tensorboard` writes a scalar."""
    name = tag.encode()
    inner = b"\x0a" + _varint(len(name)) + name + b"\x15" + struct.pack("<f", value)
    summary = b"\x0a" + _varint(len(inner)) + inner
    return (b"\x09" + struct.pack("<d", 1.7e9 + step) + b"\x10" + _varint(step)
            + b"\x2a" + _varint(len(summary)) + summary)


def event_file(path: Path, scalars: Iterable[tuple[int, str, float]]) -> Path:
    """A TensorBoard event file of one record per (step, tag, value), framed as TFRecords with
    the reader's own masked CRC32C (checked against a reference by the reader's tests)."""
    from trainguard.analyze.tensorboard import masked_crc32c

    payloads = [b"\x09" + struct.pack("<d", 1.7e9) + b"\x1a\x0dbrain.Event:2"]
    payloads.extend(scalar_event(step, tag, value) for step, tag, value in scalars)
    heads = [struct.pack("<Q", len(p)) for p in payloads]
    lengths = np.array([len(p) for p in payloads], dtype=np.int64)
    head_crc = masked_crc32c(np.frombuffer(b"".join(heads), dtype=np.uint8),
                             np.arange(len(heads), dtype=np.int64) * 8,
                             np.full(len(heads), 8, dtype=np.int64))
    body_crc = masked_crc32c(np.frombuffer(b"".join(payloads), dtype=np.uint8),
                             np.cumsum(lengths) - lengths, lengths)
    with path.open("wb") as out:
        for head, hcrc, payload, bcrc in zip(heads, head_crc.tolist(), payloads,
                                             body_crc.tolist(), strict=True):
            out.write(head + struct.pack("<I", hcrc) + payload + struct.pack("<I", bcrc))
    return path
