"""The cause ranking gives exactly the recorded answers for a fixed, varied set of event lists.

The event lists (every registered kind, a kind nobody registered, all severities, steps at the
start, early and late, LoRA and badly initialised parameters, batch causes, replay results) and
the preflight findings come from a seeded generator; `ranking_golden.json` holds, per case, the
ranked codes with their scores and a digest of the full answer (confidence, evidence, fix). A
change of the ranking's rules or weights shows here; a deliberate one is recorded again with
`python -m tests.diagnose.test_ranking_golden`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainguard.diagnose.finding import Finding
from trainguard.diagnose.ranking import RankedCause, rank_causes
from trainguard.events import Event

GOLDEN = Path(__file__).with_name("ranking_golden.json")
RANDOM_CASES = 250
SEED = 20240611

KINDS = ["nonfinite_loss", "nonfinite_grad", "loss_spike", "grad_explosion", "loss_divergence",
         "nonfinite_weight", "nonfinite_optimizer_state", "extreme_weight", "fp16_overflow",
         "bad_start", "ddp_desync", "batch_nonfinite", "batch_image_range", "batch_token_ids",
         "batch_attention_mask", "batch_outlier", "batch_size", "batch_above_chance",
         "skip_limit", "rollback", "rollback_limit", "rollback_failed", "monitor_error",
         "snapshot_failed", "my_own_kind"]
SEVERITIES = ["warning", "error", "critical"] * 3 + ["info"]
PARAMS = [None, None, "head.weight", "body.0.weight", "h.0.attn.lora_B.default.weight",
          "h.1.mlp.lora_A.default.weight"]
BATCH_CAUSE = {"batch_nonfinite": "nonfinite_input", "batch_image_range": "input_scale",
               "batch_token_ids": "tokenizer_mismatch", "batch_outlier": "outlier_batch",
               "batch_size": "batch_truncated", "batch_above_chance": "tokenizer_mismatch",
               "batch_attention_mask": None}
FINDINGS = [
    Finding("mode_and_lr", "error", "LR high", "lower it", cause="lr_too_high"),
    Finding("warmup", "warning", "no warmup", "add one", cause="missing_warmup"),
    Finding("lora_scaling", "error", "alpha/r 64", "keep it <= 1", cause="lora_scaling"),
    Finding("layer_init", "error", "head std 100", "std 0.02", cause="bad_init",
            evidence={"param": "head.weight"}),
    Finding("layer_init", "warning", "body std 3", "std 0.02", cause="bad_init",
            evidence={"param": "body.0.weight"}),
    Finding("precision", "warning", "fp16 weights", "use fp32 master", cause="optimizer_eps"),
    Finding("clipping", "info", "no clipping", "clip"),
    Finding("eps", "critical", "eps 1e-12", "eps 1e-8", cause="optimizer_eps"),
    Finding("batch_above_chance", "warning", "first loss high", "check tokenizer",
            cause="tokenizer_mismatch"),
    Finding("input", "warning", "inputs 0-255", "normalise", cause="input_scale"),
]


def _event(rng: random.Random, base_step: int) -> Event:
    kind = rng.choice(KINDS)
    step = base_step + rng.choice([0, 0, 0, 1, 2, 3, 6, 10, 40])
    details: dict[str, Any] = {}
    if BATCH_CAUSE.get(kind) and rng.random() < 0.9:
        details["cause"] = BATCH_CAUSE[kind]
    if kind == "bad_start":
        details["cause"] = rng.choice(["bad_init", "lr_too_high", "lr_too_high"])
        if rng.random() < 0.4:
            details["sustained"] = True
    if kind in ("nonfinite_loss", "nonfinite_grad") and rng.random() < 0.3:
        details["replay"] = rng.choice([{"first_nonfinite_module": "loss_head"}, {}])
    if kind == "my_own_kind" and rng.random() < 0.5:
        details["cause"] = "outlier_batch"
    message = f"{kind} seen" + (" Fix: do something" if kind.startswith("batch_") else "")
    return Event(kind=kind, step=step, severity=rng.choice(SEVERITIES),  # type: ignore[arg-type]
                 message=message, param=rng.choice(PARAMS), value=rng.choice([None, 1.5, 1e8]),
                 details=details)


@functools.cache
def cases() -> list[tuple[list[Event], list[Finding], int]]:
    rng = random.Random(SEED)
    out = []
    for _ in range(RANDOM_CASES):
        base = rng.choice([0, 0, 1, 5, 12, 19, 20, 25, 60, 120, 400])
        events = [_event(rng, base) for _ in range(rng.choice([0, 1, 1, 2, 2, 3, 4, 6]))]
        findings = rng.sample(FINDINGS, rng.choice([0, 0, 1, 2, 3]))
        out.append((events, findings, rng.choice([5, 5, 5, 3, 10])))
    return out + _repeated_kinds()


def _repeated_kinds() -> list[tuple[list[Event], list[Finding], int]]:
    """Kinds that vote once per run against kinds whose every event votes, and the rules that
    read details, each met more than once."""
    def e(kind: str, step: int, **details: Any) -> Event:
        return Event(kind=kind, step=step, severity="error", message=f"{kind} {step}",
                     details=details)

    warmup = [FINDINGS[1]]
    return [
        ([e("fp16_overflow", 30), e("fp16_overflow", 31), e("nonfinite_loss", 31)], [], 5),
        ([e("ddp_desync", 50), e("ddp_desync", 100), e("loss_spike", 100)], [], 5),
        ([e("loss_divergence", 8), e("nonfinite_weight", 8), e("grad_explosion", 3)], warmup, 5),
        ([e("bad_start", 10, cause="bad_init"), e("bad_start", 10, cause="lr_too_high"),
          e("bad_start", 50, cause="lr_too_high", sustained=True)], warmup, 5),
        ([e("batch_image_range", 0, cause="input_scale"),
          e("batch_image_range", 30, cause="input_scale"), e("loss_spike", 30)], [], 5),
        # one unnormalised batch late in the run: the inspector's specific finding explains the
        # spike and the outlier field, instead of the generic outlier batch
        ([e("batch_image_range", 40, cause="input_scale"),
          e("batch_outlier", 40, cause="outlier_batch"), e("loss_spike", 40),
          e("grad_explosion", 40)], [], 5),
    ]


def answer(ranked: list[RankedCause]) -> dict[str, Any]:
    full = json.dumps([r.to_dict() for r in ranked], sort_keys=True)
    return {"ranked": [[r.code, r.score] for r in ranked],
            "digest": hashlib.sha256(full.encode()).hexdigest()[:16]}


def record(rank: Callable[..., list[RankedCause]] = rank_causes) -> list[dict[str, Any]]:
    return [answer(rank(events, findings, top=top)) for events, findings, top in cases()]


@pytest.fixture(scope="module")
def golden() -> list[dict[str, Any]]:
    return json.loads(GOLDEN.read_text())


def test_the_cases_cover_every_family_the_ranking_reads() -> None:
    seen = {e.kind for events, _, _ in cases() for e in events}
    assert seen == set(KINDS)


@pytest.mark.parametrize("index", range(len(cases())))
def test_the_ranking_gives_the_recorded_answer(golden, index: int) -> None:
    events, findings, top = cases()[index]
    got = answer(rank_causes(events, findings, top=top))
    assert got["ranked"] == golden[index]["ranked"]  # codes, order and scores, exactly
    assert got["digest"] == golden[index]["digest"]  # evidence, fixes and confidences too


if __name__ == "__main__":  # record the current ranking's answers (after a deliberate change)
    GOLDEN.write_text(json.dumps(record(), separators=(",", ":")) + "\n")
