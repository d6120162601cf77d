"""`Journal`: the run's events and findings, and the sinks that hear them.

`record` adds a step's; the run adds what happens between steps (a refused batch, a rollback, a
monitoring failure). It is run state (`RunState.journal`): its findings (the preflight's, the
batches', the first loss's) are what a diagnosis and a proof weigh, so a checkpoint keeps them
and a resumed job, which runs no preflight, weighs them too. Its events are the sinks' record,
which the run store keeps: a resumed job's journal records its own from its first step. A
rollback unsays nothing, so the journal is not rewound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from trainguard.diagnose.coupled_decay import CHECK as COUPLED_DECAY
from trainguard.diagnose.coupled_decay import CoupledDecay
from trainguard.diagnose.double_activation import double_activation
from trainguard.diagnose.loss_broadcast import loss_broadcast
from trainguard.diagnose.unheld_params import UnheldParams
from trainguard.diagnose.unreached_params import CHECK as UNREACHED
from trainguard.diagnose.unreached_params import UnreachedParams
from trainguard.diagnose.warmup_watch import WarmupWatch
from trainguard.events import ActionRecord, Event
from trainguard.finding import Finding
from trainguard.params import WatchedParams
from trainguard.sinks import SinkSet

log = logging.getLogger("trainguard")

GRAPH_CHECKS = frozenset({"double_activation", "nll_input", "loss_broadcast"})
"""The findings read from the first loss's autograd graph (`Journal.observe_loss`)."""


@dataclass
class Journal:
    sinks: SinkSet
    events: list[Event] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    warmup_watch: WarmupWatch | None = None
    """The preflight's `warmup` finding, held until the first steps' LRs decide it."""
    unheld: UnheldParams = field(default_factory=UnheldParams)
    """Trainable parameters whose gradients no optimizer applies (checked on sampled steps)."""
    unreached: UnreachedParams = field(default_factory=UnreachedParams)
    """Trainable parameters the loss never reaches (checked on the first steps)."""
    coupled_decay: CoupledDecay = field(default_factory=CoupledDecay)
    """A weight decay added to a normalised gradient (checked on the run's first steps)."""
    graph_read: bool = False
    """The loss's autograd graph was read for an activation applied twice (once a run)."""

    def emit_event(self, event: Event) -> None:
        self.events.append(event)
        self.sinks.on_event(event)

    def emit_action(self, action: ActionRecord) -> None:
        self.sinks.on_action(action)

    def add_findings(self, findings: Iterable[Finding]) -> None:
        findings = list(findings)
        if findings:
            self.findings.extend(findings)
            self.sinks.on_findings(list(self.findings))

    def observe_lrs(self, group_lrs: tuple[float, ...]) -> list[Finding]:
        """The LRs of the step about to be taken (per param group): they decide the held
        `warmup` finding over the run's first steps. Returns the findings decided now."""
        watch = self.warmup_watch
        if watch is None:
            return []
        try:
            decided = watch.observe(group_lrs)
        except Exception as exc:  # advisory
            log.error("trainguard: warmup check failed (%s: %s)", type(exc).__name__, exc)
            decided = []
        if decided is None:
            return []
        self.warmup_watch = None
        return decided

    def observe_unheld(self, model: nn.Module, watched: WatchedParams,
                       step: int) -> list[Finding]:
        """A sampled step's check for gradients no optimizer applies (`diagnose/unheld_params`);
        returns the findings made now."""
        try:
            return self.unheld.check(model, watched, step)
        except Exception as exc:  # advisory
            log.error("trainguard: unheld-parameter check failed (%s: %s)",
                      type(exc).__name__, exc)
            return []

    def observe_unreached(self, watched: WatchedParams, step: int) -> list[Finding]:
        """One of the run's first steps' or sampled steps' check for trainable parameters the
        loss never reaches (`diagnose/unreached_params`); returns the findings made now."""
        return self._early_check(self.unreached, UNREACHED,
                                 lambda: self.unreached.check(watched, step))

    def observe_coupled_decay(self, optimizers: list[Any], step: int) -> list[Finding]:
        """One of the run's first steps' check for a weight decay that weighs on the gradient it
        is added to (`diagnose/coupled_decay`); returns the findings made now."""
        return self._early_check(self.coupled_decay, COUPLED_DECAY,
                                 lambda: self.coupled_decay.check(optimizers, step))

    def _early_check(self, check: CoupledDecay | UnreachedParams, name: str,
                     run: Callable[[], list[Finding]]) -> list[Finding]:
        """A check that judges a few early steps and is then done: not again once its finding
        is there (told before a resume), and never the cause of a failed step."""
        if check.done:
            return []
        if any(f.check == name for f in self.findings):
            check.done = True
            return []
        try:
            return run()
        except Exception as exc:  # advisory
            check.done = True
            log.error("trainguard: %s check failed (%s: %s)", name, type(exc).__name__, exc)
            return []

    def observe_loss(self, loss: Any) -> list[Finding]:
        """The first loss with an autograd graph: does it apply a softmax (or sigmoid) twice,
        or hand `nll_loss` what is not log-probabilities (`diagnose/double_activation`), or
        broadcast predictions against targets of another shape (`diagnose/loss_broadcast`)?
        Returns the findings made now."""
        if self.graph_read or getattr(loss, "grad_fn", None) is None:
            return []
        self.graph_read = True
        if any(f.check in GRAPH_CHECKS for f in self.findings):
            return []  # told before a resume
        found = []
        for check in (double_activation, loss_broadcast):
            try:
                finding = check(loss)
            except Exception as exc:  # advisory
                log.error("trainguard: loss graph check failed (%s: %s)",
                          type(exc).__name__, exc)
                continue
            if finding is not None:
                found.append(finding)
        return found

    def settle_warmup(self) -> None:
        """A run that ended within the warmup watch: judged on the steps it had."""
        watch, self.warmup_watch = self.warmup_watch, None
        if watch is None:
            return
        try:
            self.add_findings(watch.settle())
        except Exception as exc:  # advisory
            log.error("trainguard: warmup check failed (%s: %s)", type(exc).__name__, exc)

    def state_dict(self) -> dict[str, Any]:
        return {"findings": [f.to_dict() for f in self.findings]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        findings = state.get("findings")
        if isinstance(findings, list):
            self.findings = [Finding.from_dict(f) for f in findings
                             if isinstance(f, Mapping) and _WHOLE <= f.keys()]


_WHOLE = {"check", "severity", "message"}
"""What a finding kept in a checkpoint has at least (anything else defaults)."""
