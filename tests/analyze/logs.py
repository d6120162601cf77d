"""Small training logs written by the tests (never the real logs of the evaluation set)."""

from __future__ import annotations

import json
import math
from pathlib import Path


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
