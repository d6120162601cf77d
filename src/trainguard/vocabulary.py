"""The words trainguard answers with, as types: what a step did, how a run ended, what its
verdict is. Type hints only: the values stay plain strings everywhere (in events, the store, the
sinks' metrics and the reports).

Event kinds and metric keys are not here: the registry (`trainguard.registry`) holds those, with
what trainguard needs to know about each.

Only the standard library here: every part of trainguard may import this module.
"""

from __future__ import annotations

from typing import Literal, get_args

Action = Literal["applied", "clipped", "skipped", "halted", "rolled_back"]
"""What the Guard did with a step's update (`StepReport.action`, `Decision.action`)."""

Status = Literal["running", "finished", "halted", "failed", "crashed", "interrupted"]
"""How a run stands or ended: `running` until it is closed; `failed` when a rank was lost under
torch.distributed; `crashed` or `interrupted` when an exception ended it (`trainguard.run_end`),
or `interrupted` when its process ended without closing it."""

Verdict = Literal["healthy", "recovered", "degraded", "stalled"]
"""The run's verdict (`RunVerdict.verdict`): did it end better than it was?"""

ACTIONS: tuple[Action, ...] = get_args(Action)
STATUSES: tuple[Status, ...] = get_args(Status)
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)

HIDDEN_LOSS = "hidden_by_trainer_log"
"""The detail a `nonfinite_loss` event carries when the trainer's logged loss hides it (the
Hugging Face Trainer's `logging_nan_inf_filter`)."""
