"""The words trainguard answers with, as types: what a step did, how a run ended, what its
verdict is. Type hints only: the values stay plain strings everywhere (in events, the store, the
sinks' metrics and the reports).

Event kinds and metric keys are not here: the registry (`trainguard.registry`) holds those, with
what trainguard needs to know about each.

Only the standard library here: every part of trainguard may import this module.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

Action = Literal["applied", "clipped", "skipped", "halted", "rolled_back"]
"""What the Guard did with a step's update (`StepReport.action`, `Decision.action`)."""

Status = Literal["running", "finished", "halted", "failed", "crashed", "interrupted"]
"""How a run stands or ended: `running` until it is closed; `failed` when a rank was lost under
torch.distributed; `crashed` or `interrupted` when an exception ended it (`trainguard.run_end`),
or `interrupted` when its process ended without closing it."""

Verdict = Literal["healthy", "recovered", "degraded", "stalled"]
"""Whether training worked, one word with one meaning for a guarded run (`RunVerdict.verdict`,
judged at its close by `trainguard.verdict`) and for a log (`trainguard analyze`, judged by
`trainguard.analyze.judge`), both by the same rule of "worse" (`verdict.ended_worse`):

    healthy     no trouble, and the loss did not end worse than it started
    recovered   trouble came, and the loss came back to its level from before it
    degraded    the loss ended worse than before its trouble, or non-finite, or the run ended
                skipping its updates: what the run shows, without saying how far it would go
                (how it went wrong is the analysis's kind: nan, explosion, slow-divergence)
    stalled     the loss never came down beyond its own noise (a guarded run only: a log's
                loss alone does not tell a stall from a slow task)

No verdict (None) where the run or log does not show one (too short to judge, or a loss whose
level says nothing of training: `nll_loss` of raw scores)."""

HEALTHY: Final = "healthy"
RECOVERED: Final = "recovered"
DEGRADED: Final = "degraded"
STALLED: Final = "stalled"

NOT_WORKING: frozenset[Verdict] = frozenset({DEGRADED, STALLED})
"""The verdicts that say training did not work: shouted, and `show` points to why."""

OLD_VERDICTS: dict[str, Verdict] = {"spike-recovered": RECOVERED, "diverged": DEGRADED}
"""The words `trainguard analyze` used before the live and offline verdicts shared one
vocabulary, and what they say now."""


def verdict_named(word: object) -> Verdict | None:
    """The verdict `word` says, in today's words (an older word mapped); None when it is none."""
    if word in VERDICTS:
        return word
    return OLD_VERDICTS.get(word) if isinstance(word, str) else None


ACTIONS: tuple[Action, ...] = get_args(Action)
STATUSES: tuple[Status, ...] = get_args(Status)
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)

HIDDEN_LOSS = "hidden_by_trainer_log"
"""The detail a `nonfinite_loss` event carries when the trainer's logged loss hides it (the
Hugging Face Trainer's `logging_nan_inf_filter`)."""
