"""Samples seen, wherever the steps come from: the Guard and the trainer callbacks with a
`sample_fn` make a generative model's samples on their own cadence after a step, judge them
against the run's first ones and hand them, drawn, to the sinks.

The parts: `probes/samples.py` (making them, neutrally, on a budget), `detect/sample_judge.py`
(the judgement, event `samples_degraded`), `probes/sample_sheet.py` (the drawing). The first
samples are made before the first update, from the model as given: the reference.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import nn

from trainguard.config import GuardConfig
from trainguard.detect.sample_judge import SampleJudge
from trainguard.probes.samples import SampleFn, SampleProbe

if TYPE_CHECKING:
    from trainguard.pipeline.run import Run

log = logging.getLogger("trainguard")


class SamplesSeen:
    def __init__(self, sample_fn: SampleFn, config: GuardConfig) -> None:
        probes = config.probes
        self.probe = SampleProbe(sample_fn, probes.samples_every, probes.samples_budget)
        self.judge = SampleJudge()

    @property
    def last(self) -> torch.Tensor | None:
        """The last samples made (at most 8, on the host), or None."""
        return self.probe.last

    def before_first_update(self, model: nn.Module, run: Run) -> None:
        """The reference samples, once: the model as given, before any update of this run."""
        if self.judge.reference is None:
            self.after_step(model, run, run.steps_taken - 1)

    def after_step(self, model: nn.Module, run: Run, step: int) -> None:
        """The samples after `step`'s update, when due: judged, any event recorded, drawn for
        the sinks."""
        first = self.judge.reference is None
        if not (first or self.probe.due(step)) or run.closed:
            return
        stats = self.probe.take(model, step)
        if stats is None:
            return
        for event in self.judge.judge(step, stats):
            run.emit_event(event)
        run.samples_broken = self.judge.broken
        try:
            sheet = self.probe.sheet(step, stats, degraded=self.judge.broken is not None)
        except Exception as exc:  # a drawing's bug never stops the training
            log.error("trainguard: the samples after step %d could not be drawn (%s: %s)",
                      step, type(exc).__name__, exc)
            return
        if sheet is not None:
            run.sinks.on_samples(sheet)
