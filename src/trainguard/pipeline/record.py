"""Stage 7, `record`: tell the sinks what happened at this step.

The parameters the optimizer gained, the step's new findings, its events (with their likely
causes and replay), the actions taken and the step report go to every sink (the console, the run
store, the user's), in that order; no other stage talks to the sinks. A failing sink is reported
once and disabled by the `SinkSet`; training never notices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainguard.pipeline.context import StepContext

if TYPE_CHECKING:
    from trainguard.pipeline.run import Run


class Record:
    name = "record"

    def __init__(self, run: Run) -> None:
        self.run = run

    def __call__(self, ctx: StepContext) -> None:
        run = self.run
        if ctx.new_params is not None:
            run.emit_action(ctx.new_params)
        run.add_findings(ctx.findings)
        run.events.extend(ctx.events)
        for event in ctx.events:
            run.sinks.on_event(event)
        for action in ctx.actions:
            run.sinks.on_action(action)
        if ctx.report is not None:
            run.sinks.on_step(ctx.report)
