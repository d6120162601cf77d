"""Stage 7, `record`: tell the sinks what happened at this step.

The parameters the optimizer gained, the step's new findings, its events (with their likely
causes and replay), the actions taken and the step report go to every sink (the console, the run
store, the user's), in that order; no other stage talks to the sinks. A failing sink is reported
once and disabled by the `SinkSet`; training never notices.

The step's events go out in step order: the heavy probes of a sampled step are read at the next
step, so an event they raise (a weight or an update of step t-1) is detected beside the events of
step t, after them.
"""

from __future__ import annotations

from trainguard.pipeline.context import Settled, StepContext
from trainguard.pipeline.services import Services
from trainguard.pipeline.state import RunState


def record(ctx: StepContext, state: RunState, services: Services, settled: Settled) -> None:
    journal = state.journal
    if ctx.new_params is not None:
        journal.emit_action(ctx.new_params)
    journal.add_findings(ctx.findings)
    ctx.events.sort(key=lambda event: event.step)  # stable: a step's own order is kept
    for event in ctx.events:
        journal.emit_event(event)
    for action in ctx.actions:
        journal.emit_action(action)
    journal.sinks.on_step(settled.report)
