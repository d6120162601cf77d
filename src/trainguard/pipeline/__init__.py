"""The step pipeline: one optimizer step as an explicit, ordered list of stages.

    measure -> detect -> explain -> decide -> act  |optimizer step|  settle -> record

`Run` builds everything the stages use and owns the run's life; `StepPipeline` (steps.py) holds
the order and hands each stage's typed result to the stages that read it; `StepContext` carries
one step from its check to its settling; `RunState` is the one home of the runtime state. See
docs/architecture.md.
"""

from trainguard.pipeline.context import StepContext
from trainguard.pipeline.policy import Decision, choose_action
from trainguard.pipeline.run import Run
from trainguard.pipeline.state import RunState
from trainguard.pipeline.steps import AFTER_UPDATE, BEFORE_UPDATE, STAGE_NAMES, StepPipeline

__all__ = ["AFTER_UPDATE", "BEFORE_UPDATE", "STAGE_NAMES", "Decision", "Run", "RunState",
           "StepContext", "StepPipeline", "choose_action"]
