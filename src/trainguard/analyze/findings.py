"""What else the log says about the cause: its LR schedule, its gradient norms, its skipped steps.

Each reading is a `Finding` (the preflight's vocabulary: a check, a severity, a message, a fix, a
cause code) that the cause ranking weighs with the events, as it weighs the preflight's findings
on a live run:

    log_lr            the peak LR is above the guide's Adam(W) ranges (5e-3, the top of the LoRA
                      range): lr_too_high
    log_warmup        a log that starts at the start of training with the LR already at its peak
                      (no warmup), and trouble in its first tenth: missing_warmup
    log_lr_peak       the trouble began while the LR was at (or just reached) its peak: lr_too_high
    log_grad_growth   the gradient norm grew tenfold or more over the run: lr_too_high
    log_grad_level    the gradient norm above the guide's explosion limit (1000) around the
                      onset (no detection uses that limit offline, a model's own scale can be
                      that large; as a clue beside trouble it counts): lr_too_high
    log_no_recovery   one jump, and the loss never came back to its level: one odd batch does
                      not keep a run broken (the ranking's generic reading of a single late
                      jump), so the jump is the run's own instability: lr_too_high
    log_grad_history  the gradient norm jumped (isolated jumps) before the trouble: lr_too_high
    log_skipped       steps skipped by fp16 overflows (frozen LR, overflow messages, a falling
                      loss scale): fp16_overflow
"""

from __future__ import annotations

import math
import statistics

from trainguard.analyze.judge import Judgement
from trainguard.analyze.log import GRAD_NORM, LR, Log
from trainguard.config import DetectorConfig
from trainguard.diagnose.causes import CAUSES
from trainguard.diagnose.lr_range import ADAPTER_LR_RANGE, GUIDE_RANGES
from trainguard.finding import Finding
from trainguard.registry import Kind
from trainguard.vocabulary import DEGRADED, HEALTHY

ADAM_LR_MAX = ADAPTER_LR_RANGE[1]
"""The top of the guide's Adam(W) ranges (LoRA: 1e-4..5e-3; full fine-tuning 1e-6..5e-5)."""
GRAD_LIMIT = DetectorConfig().grad_explosion.abs_threshold
"""The guide's rule of thumb for an exploding pre-clip gradient norm (1000)."""
EARLY_SHARE = 0.1
GROWTH = 10.0


def log_findings(log: Log, judgement: Judgement) -> list[Finding]:
    if judgement.verdict == HEALTHY:
        return []
    found: list[Finding] = []
    onset = judgement.onset_row if judgement.onset_row is not None else 0
    lrs = [(i, v) for i, v in enumerate(log.values(LR)) if v is not None and math.isfinite(v)]
    if lrs:
        peak_row, peak = max(lrs, key=lambda item: item[1])
        if peak > ADAM_LR_MAX:
            found.append(Finding("log_lr", "error" if peak > 10 * ADAM_LR_MAX else "warning",
                                 f"the peak learning rate {peak:.3g} is above the guide's "
                                 f"ranges ({GUIDE_RANGES}; plain SGD takes larger ones)",
                                 CAUSES["lr_too_high"].fix, "lr_too_high",
                                 {"peak_lr": peak}))
        starts = log.starts_at_start()
        first = lrs[0][1]
        if (starts and first >= 0.9 * peak and onset <= max(1, EARLY_SHARE * len(log))
                and judgement.kind != "nan"):
            found.append(Finding("log_warmup", "warning",
                                 f"the learning rate is at its peak {peak:.3g} from the first "
                                 f"logged step on: no warmup, and the trouble came early",
                                 CAUSES["missing_warmup"].fix, "missing_warmup"))
        at_onset = log.values(LR)[onset]
        if (at_onset is not None and peak > 0 and at_onset >= 0.9 * peak and peak_row <= onset
                and not any(f.check == "log_warmup" for f in found) and first < 0.9 * peak):
            found.append(Finding("log_lr_peak", "warning",
                                 f"the trouble began at {log.label(onset)}, with the learning "
                                 f"rate at its peak {peak:.3g} (reached at "
                                 f"{log.label(peak_row)})",
                                 CAUSES["lr_too_high"].fix, "lr_too_high"))
    grads = [v for v in log.values(GRAD_NORM) if v is not None and math.isfinite(v) and v > 0]
    if len(grads) >= 8:
        quarter = max(2, len(grads) // 4)
        head, tail = statistics.median(grads[:quarter]), statistics.median(grads[-quarter:])
        if tail >= GROWTH * head:
            found.append(Finding("log_grad_growth", "warning",
                                 f"the gradient norm grew {tail / head:.3g}-fold over the run "
                                 f"(median {head:.3g} in its first quarter, {tail:.3g} in its "
                                 "last)", CAUSES["lr_too_high"].fix, "lr_too_high"))
    around = [v for v in log.values(GRAD_NORM)[max(0, onset - 1):onset + 2]
              if v is not None and math.isfinite(v)]
    if around and max(around) > GRAD_LIMIT:
        found.append(Finding("log_grad_level", "warning",
                             f"the gradient norm was {max(around):.4g} around the onset, above "
                             f"the guide's explosion limit "
                             f"{GRAD_LIMIT:g}",
                             CAUSES["lr_too_high"].fix, "lr_too_high"))
    single = [e for e in judgement.incident if e.kind in (Kind.LOSS_SPIKE, Kind.GRAD_EXPLOSION)]
    if (judgement.verdict == DEGRADED and judgement.kind in ("explosion", "slow-divergence")
            and len(single) == 1 and judgement.back is None):
        found.append(Finding("log_no_recovery", "warning",
                             f"the loss never came back after the jump at "
                             f"{log.label(single[0].details['row'])}: not a one-off, the "
                             "run's own instability", CAUSES["lr_too_high"].fix, "lr_too_high"))
    jumps = [e for e in judgement.isolated if e.kind == Kind.GRAD_EXPLOSION
             and e.details["row"] < onset]
    if jumps:
        shown = ", ".join(f"{e.value:.3g} at {log.label(e.details['row'])}" for e in jumps[:3])
        found.append(Finding("log_grad_history", "info",
                             f"the gradient norm jumped before the trouble ({shown})",
                             CAUSES["lr_too_high"].fix, "lr_too_high"))
    skipped = log.skipped or []
    count = sum(skipped)
    if count:
        first_skip = skipped.index(True)
        found.append(Finding("log_skipped", "warning",
                             f"{count} logged step(s) were skipped (no update: an fp16 "
                             "loss scaler's overflow, or a step a guard dropped; the log does "
                             f"not say which), the first at {log.label(first_skip)}",
                             CAUSES["fp16_overflow"].fix, "fp16_overflow", {"skipped": count}))
    return found
