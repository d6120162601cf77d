"""A scheduler sized for fewer optimizer steps than the run takes, told before the first step.

A trainer knows the run's length (the HF Trainer's `max_steps`, Lightning's stepping batches);
the scheduler says its own where it has one (`run_length`). When the scheduler is shorter, what
it does past its end is read from its closed form, without stepping it: a linear or polynomial
decay sits at LR 0 for the rest of the run (`lr_at_zero`: those steps train nothing), and
`OneCycleLR` refuses to step past its end (the run stops with a `ValueError` there). A cosine that
goes round again is neither, and says nothing here.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from trainguard.finding import Finding

PROBED = 2048
"""Steps past the scheduler's end whose LR is read in a row, and as many more spread over the
rest of a longer run."""
MIN_STEPS = 10
"""Steps at 0 past the scheduler's end that are told (`detectors.lr_at_zero.steps`' default:
a decay that lands on 0 for its last step or two is no news)."""


def run_length(scheduler: Any) -> int | None:
    """The run's length in scheduler steps, where the scheduler says it: OneCycleLR's
    `total_steps`, CosineAnnealingLR's `T_max`, PolynomialLR's `total_iters`, and for a LambdaLR
    the `total_steps` of trainguard's `WarmupSchedule` or the `num_training_steps` of the
    transformers schedules (`get_linear_schedule_with_warmup` and its kin)."""
    if scheduler is None:
        return None
    known = [getattr(scheduler, name, None) for name in ("total_steps", "T_max")]
    if type(scheduler).__name__ == "PolynomialLR":
        known.append(getattr(scheduler, "total_iters", None))
    for schedule in getattr(scheduler, "lr_lambdas", None) or []:
        known.append(getattr(schedule, "total_steps", None))
        keywords = getattr(schedule, "keywords", None)  # a functools.partial's
        if isinstance(keywords, dict):
            known.append(keywords.get("num_training_steps"))
    steps = [int(k) for k in known if isinstance(k, (int, float)) and not isinstance(k, bool)
             and math.isfinite(k) and k > 0]
    return steps[0] if steps else None


def lrs_at(scheduler: Any, steps: Iterable[int]) -> list[list[float]] | None:
    """The groups' LRs the scheduler gives at each of `steps` (its `last_epoch`), from its
    closed form (a LambdaLR's lambdas, the `_get_closed_form_lr` of the torch schedulers that
    have one), the scheduler left as it was; None where it has none. Raises what the scheduler
    raises."""
    if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        read = scheduler.get_lr
    elif callable(getattr(scheduler, "_get_closed_form_lr", None)):
        read = scheduler._get_closed_form_lr
    else:
        return None
    saved = scheduler.last_epoch
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "use get_last_lr()": this is no step
            found = []
            for step in steps:
                scheduler.last_epoch = step
                found.append([float(lr) for lr in read()])
            return found
    finally:
        scheduler.last_epoch = saved


def _probed(length: int, total_steps: int) -> list[int]:
    """The steps past the scheduler's end whose LR is read: the first `PROBED` in a row (a
    schedule that goes round again leaves 0 at once), then `PROBED` spread over the rest."""
    first = list(range(length, min(total_steps, length + PROBED)))
    if length + PROBED >= total_steps:
        return first
    rest = np.linspace(length + PROBED, total_steps - 1, PROBED).round().astype(int)
    return first + sorted(set(rest.tolist()))


def schedule_end(scheduler: Any, total_steps: int | None) -> list[Finding]:
    """The finding for a fresh scheduler (`last_epoch` 0) shorter than a run of `total_steps`
    optimizer steps by `MIN_STEPS` or more, where what it does past its end is known; none
    otherwise."""
    length = run_length(scheduler)
    if (length is None or total_steps is None or total_steps - length < MIN_STEPS
            or getattr(scheduler, "last_epoch", None) != 0):
        return []
    name = type(scheduler).__name__
    evidence = {"scheduler": name, "scheduler_steps": length, "total_steps": total_steps}
    if isinstance(scheduler, torch.optim.lr_scheduler.OneCycleLR):
        # it refuses a step past `total_steps`: the one after the optimizer's `length + 1`th
        return [Finding(
            "schedule_end", "warning",
            f"the LR scheduler ({name}) is sized for {length} optimizer steps and the run "
            f"takes {total_steps}: it refuses to step past its end, so the run stops with a "
            f"ValueError after {length + 1} optimizer steps.",
            f"give it the optimizer steps the run takes: total_steps={total_steps}.",
            evidence=evidence)]
    try:
        past_end = lrs_at(scheduler, _probed(length, total_steps))
        zero = past_end is not None and all(lrs and not any(lrs) for lrs in past_end)
    except Exception:  # a schedule of the user's own that fails here is not this check's
        return []
    if not zero:
        return []
    return [Finding(
        "schedule_end", "warning",
        f"the LR scheduler ({name}) is sized for {length} optimizer steps and the run takes "
        f"{total_steps}: its LR is 0 from step {length} on, so the last "
        f"{total_steps - length} steps would train nothing.",
        f"give the scheduler the optimizer steps the run takes ({total_steps}: "
        "num_training_steps, total_iters, T_max), and step it once per optimizer step.",
        cause="lr_at_zero", evidence=evidence)]
