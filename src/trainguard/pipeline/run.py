"""`Run`: one guarded training run, whoever takes its optimizer steps.

It builds, from the configuration and the user's objects, everything the stages use (the watched
parameters, the probes, the detectors, the batch inspector, the recover policy, the sinks) and the
runtime state (`RunState`), and it owns the run's life: start (preflight audit, sinks told), the
events and findings outside a step, the diagnosis, the state dict and the close. The step itself
is `StepPipeline`'s; the `Guard` and the framework callbacks are thin adapters around both.
"""

from __future__ import annotations

import hashlib
import logging
import statistics
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainguard import __version__, lifecycle
from trainguard.config import GuardConfig
from trainguard.detect import default_detectors
from trainguard.detect.metric_collapse import MetricCollapse
from trainguard.diagnose import Finding, preflight
from trainguard.diagnose.batch_watch import BatchWatch
from trainguard.diagnose.incidents import IncidentProver
from trainguard.diagnose.preflight import RunSetup
from trainguard.diagnose.ranking import RankedCause, rank_causes
from trainguard.diagnose.replay import LossFn
from trainguard.diagnose.warmup_watch import WarmupWatch
from trainguard.distributed import (
    AGREED_CONFIG_FIELDS_EXCLUDED,
    LocalShardGradientProbe,
    RankAgreement,
    agree_on_start,
    describe,
    distributed_context,
)
from trainguard.errors import BatchError, PeerLost, StoreUnavailable, UsageError
from trainguard.events import ActionRecord, Event, RunInfo, at_least
from trainguard.params import new_params, optimizer_param_count, watched_params
from trainguard.pipeline.act import apply_rollback
from trainguard.pipeline.detect import run_detectors
from trainguard.pipeline.measure import flush_pending
from trainguard.pipeline.rewind import ScheduleRewind
from trainguard.pipeline.state import RunState
from trainguard.pipeline.steps import StepPipeline
from trainguard.probes.activations import ActivationProbe
from trainguard.probes.gradients import GradientProbe
from trainguard.probes.optimizer_state import OptimizerStateProbe
from trainguard.probes.outputs import OutputProbe
from trainguard.probes.weights import WeightProbe
from trainguard.recovery import Recovery, Verdict
from trainguard.remedies import build_agc, build_rule
from trainguard.remedies.robust import RobustClipLimit
from trainguard.sinks import ConsoleSink, Sink, SinkSet
from trainguard.snapshot import clean_stale_temps, portable
from trainguard.store import RunStore, RunStoreSink
from trainguard.verdict import LossTrack, RunVerdict
from trainguard.vocabulary import Status

log = logging.getLogger("trainguard")


class Run:
    """`scheduler` is restored on a rollback and audited by the preflight. `rewind_schedulers`
    are the schedulers a *trainer* steps after every optimizer step, skipped or not: they are put
    back after skipped and rolled-back steps. `owns_scaler_step`: the caller runs
    `scaler.update()` itself after the checks (the Guard); a rollback then closes the scaler's
    step before restoring it. `resume`: continue the latest run recorded in `run_dir` instead of
    starting a new one there. `mid_run`: the job restarts from a checkpoint (the preflight, which
    would misread a schedule already under way, is skipped)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                 config: GuardConfig | None = None, run_dir: str | Path | None = None,
                 sinks: Iterable[Sink] = (), scaler: Any = None, scheduler: Any = None,
                 rewind_schedulers: Iterable[Any] = (), replay_fn: LossFn | None = None,
                 owns_scaler_step: bool = False, integration: str = "", resume: bool = False,
                 mid_run: bool = False) -> None:
        config = config if config is not None else GuardConfig()
        if not isinstance(config, GuardConfig):
            raise UsageError(f"config must be a trainguard.GuardConfig, got "
                             f"{type(config).__name__}")
        if not isinstance(model, nn.Module):
            raise UsageError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise UsageError(f"optimizer must be a torch.optim.Optimizer, got "
                             f"{type(optimizer).__name__}")
        self.config = config
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.replay_fn = replay_fn
        self.owns_scaler_step = owns_scaler_step
        self.watched = watched_params(model, [optimizer])
        self.device = self.watched.params[0].device
        self.scaler = scaler if scaler is not None and _scaler_enabled(scaler) else None
        self.dist = distributed_context(self.device)
        """This rank under torch.distributed (world size > 1); None for a single process."""
        self.is_main = self.dist is None or self.dist.is_main
        """Only rank 0 writes the run store and runs the sinks and the console."""
        self.run_dir = _run_dir(run_dir)
        self.halted = False
        """The Guard halted this run (a crash snapshot, `TrainingDiverged`)."""
        if self.dist is not None:  # every rank or none, before any collective
            start = agree_on_start(self.dist, self._agreed_setup(config), config.rank_timeout_s)
            self.dist.link.open(self.dist, config.collective_timeout_s, start)
            self.dist.link.on_lost = _on_lost(self)
        self._monitor_error: tuple[str, int, int, int] | None = None
        """The last monitoring failure reported: its text, its first step, how often it recurred
        since and the last step it did."""

        # what the stages use
        self._params_seen = optimizer_param_count([optimizer])
        self._build_param_probes()
        self.optstate_probe = OptimizerStateProbe(self.watched, [optimizer])
        self.activation_probe = ActivationProbe(model) if config.activation_probe else None
        self.output_probe = OutputProbe(model) if config.output_probe else None
        self.batches = BatchWatch(model, config.batch_size)
        self.rewind = ScheduleRewind(optimizer, [s for s in rewind_schedulers if s is not None])
        self.agc = build_agc(config.agc) if config.agc is not None else None
        self.state = RunState(
            max_grad_norm=config.fixed_max_grad_norm,
            auto_clip=_auto_clip(config),
            detectors=default_detectors(config.detectors),
            clip_rule=build_rule(config.clip_rule) if config.clip_rule is not None else None,
            losses=LossTrack(stall_steps=config.detectors.stall_steps),
            metric_watch=MetricCollapse(config.detectors), batches=self.batches)
        self.events: list[Event] = []
        self.findings: list[Finding] = []
        self.prover = IncidentProver(self)
        """Proves the causes of an incident by replaying its step (`diagnose/incidents.py`)."""
        self.warmup_watch: WarmupWatch | None = None
        """The preflight's `warmup` finding, held until the first steps' LRs decide it."""
        self.closed = False
        self.verdict: RunVerdict | None = None
        """Whether training worked (healthy, recovered, degraded), known once the run closed."""

        # sinks: only rank 0 speaks and records
        self.store: RunStore | None = None
        all_sinks: list[Sink] = []
        if self.is_main:
            if config.console:
                all_sinks.append(ConsoleSink())
            store_sink = self._open_store(resume)
            if store_sink is not None:
                all_sinks.append(store_sink)
                self.store = store_sink.store
            all_sinks.extend(sinks)
        self.sinks = SinkSet(all_sinks)
        self.sinks.on_run_start(RunInfo(
            run_dir=str(self.run_dir) if self.run_dir is not None else None,
            config=config.to_dict(), param_names=list(self.watched.names),
            param_shapes=[list(p.shape) for p in self.watched.params],
            trainguard_version=__version__, integration=integration,
            distributed=describe(self.dist), resume=resume))
        self._lifecycle = lifecycle.track(_closer(self)) if self.is_main else None
        # a process killed while writing a crash snapshot left a hidden temporary file as large
        # as the snapshot: the directory this run's snapshots go to is cleared of those
        clean_stale_temps(Path(config.snapshot_dir) if config.snapshot_dir else (
            self.run_dir if self.run_dir is not None else Path("trainguard_snapshots")))

        if config.preflight and not mid_run:
            self._run_preflight()
        if config.policy == "recover":
            self.state.recovery = Recovery(
                dist=self.dist, model=model, optimizers=[optimizer],
                scheduler=scheduler, scaler=self.scaler, config=config)
            self.state.recovery.start(self.state.step, self.state.rewind_state())
        self.steps = StepPipeline(self)
        self.schedule_sampling()

    # -- sampling --------------------------------------------------------------------------------
    @property
    def sampled_now(self) -> bool:
        """Whether the step about to be measured runs the heavy probes."""
        return self.state.sampled_now

    @property
    def metric_watch(self) -> MetricCollapse:
        """`metric_collapse` on the evaluation metrics (its state is in `RunState`)."""
        assert self.state.metric_watch is not None
        return self.state.metric_watch

    @property
    def output_classes(self) -> int | None:
        return self.state.output_classes

    def is_sampled(self, step: int) -> bool:
        return self.config.sample_all_steps or step % self.config.sample_every == 0

    def schedule_sampling(self, after_event: bool = False) -> None:
        """Decide before the forward pass of the next step whether it is sampled (by the
        schedule, after an event of the step before, or as a resumed run's state says); attach
        the activation hooks if so."""
        state = self.state
        state.sampled_now = self.is_sampled(state.step) or state.sample_next or after_event
        state.sample_next = False
        if state.sampled_now and self.activation_probe is not None:
            self.activation_probe.attach()
        if state.sampled_now and self.output_probe is not None:
            self.output_probe.attach()

    def _agreed_setup(self, config: GuardConfig) -> dict[str, Any]:
        """What every rank must share: the configuration (less what a rank may set for itself),
        the version and the watched parameters, which lay out the per-step all-reduce."""
        settings = {k: v for k, v in config.to_dict().items()
                    if k not in AGREED_CONFIG_FIELDS_EXCLUDED}
        names = "\n".join(self.watched.names)
        return {"trainguard": __version__, "config": settings,
                "watched parameters": len(self.watched),
                "parameter names": hashlib.sha1(names.encode()).hexdigest()[:16]}

    # -- the watched parameters ------------------------------------------------------------------
    def _build_param_probes(self) -> None:
        """What depends on the list of watched parameters (their count, devices and dtypes)."""
        self.ranks = RankAgreement(self.dist, self.watched) if self.dist is not None else None
        """One all-reduce per step and the desync check, so that every rank decides alike."""
        self.grad_probe = (GradientProbe(self.watched) if self.dist is None
                           else LocalShardGradientProbe(self.watched))
        self.weight_probe = WeightProbe(self.watched)

    def watch_new_params(self, step: int) -> ActionRecord | None:
        """Parameters the optimizer gained since the last step (`add_param_group`, as progressive
        unfreezing does) are watched, clipped and skipped from this step on; returns the notice
        for the sinks (None when nothing was added). Checked every step
        by counting the optimizer's parameters; the lists are rebuilt only when it changed.
        Under torch.distributed every rank adds the same groups at the same step (the same code
        runs everywhere), so the ranks rebuild their agreement alike."""
        count = optimizer_param_count([self.optimizer])
        if count == self._params_seen:
            return None
        self._params_seen = count
        added = new_params(self.watched, self.model, [self.optimizer])
        if not len(added):
            return None
        self.watched.extend(added)
        self._build_param_probes()
        recovery = self.state.recovery
        if recovery is not None:  # good states hold the old parameter groups: start afresh
            recovery.ring.discard_after(-1)
            recovery.start(self.state.step, self.state.rewind_state())
        shown = ", ".join(added.names[:5]) + (", ..." if len(added) > 5 else "")
        return ActionRecord(
            kind="watch", step=step,
            message=f"the optimizer gained {len(added)} parameter(s) ({shown}): watched from "
                    f"step {step}",
            details={"names": list(added.names), "shapes": [list(p.shape) for p in added.params],
                     "count": len(self.watched)})

    # -- outside a step --------------------------------------------------------------------------
    def emit_event(self, event: Event) -> None:
        """An event outside a step's report (a batch refused before its forward pass, a rollback
        between steps, a monitoring failure)."""
        self.events.append(event)
        self.sinks.on_event(event)

    def emit_action(self, action: ActionRecord) -> None:
        self.sinks.on_action(action)

    def add_findings(self, findings: list[Finding]) -> None:
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

    def observe_eval(self, metrics: Mapping[str, Any], step: int | None = None) -> list[Event]:
        """Evaluation metrics of the model at `step` (default: the last step taken): stored,
        handed to the sinks, and judged by `metric_collapse`. Returns its events."""
        if not isinstance(metrics, Mapping):
            raise UsageError(f"metrics must be a mapping of names to numbers, got "
                             f"{type(metrics).__name__}")
        at = max(self.state.step - 1, 0) if step is None else int(step)
        numbers = {str(k): float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.sinks.on_eval(at, numbers)
        losses = self.state.losses
        train = statistics.median(losses.recent) if losses.recent else None
        try:
            events = self.metric_watch.observe(
                numbers, at, classes=self.config.num_classes or self.output_classes,
                train_loss=train)
        except Exception as exc:  # a monitoring bug must not kill the run
            log.error("trainguard: evaluation check failed (%s: %s)", type(exc).__name__, exc)
            return []
        for event in events:
            self.emit_event(event)
        if any(at_least(e.severity, "warning") for e in events):
            losses.observe(at, None, trouble=True)
        return events

    def check_batch(self, batch: Any) -> list[Finding]:
        """Inspect a batch before the forward pass; raise BatchError (and record the event) for
        one the model cannot take."""
        findings, fatal = self.batches.fatal(batch, self.state.step)
        if fatal is not None:
            self.emit_event(fatal)
            raise BatchError(fatal.message)
        return findings

    def rollback(self, reason: str, *, to_step: int | None = None) -> Event:
        """Roll back between two steps (see `Guard.rollback`)."""
        recovery = self.state.recovery
        if recovery is None:
            raise UsageError("rollback needs GuardConfig(policy='recover') (it keeps good states)")
        if not recovery.can_roll_back():
            raise UsageError("there is no good state to roll back to yet")
        step = self.state.step - 1
        onset = step + 1 if to_step is None else to_step
        event = apply_rollback(self.state, recovery.rollback(
            Verdict("rollback", reason, onset=onset), step, mid_step=False))
        self.emit_event(event)
        self.emit_action(ActionRecord(kind="rollback", step=step, message=event.message,
                                      details=dict(event.details)))
        return event

    def unguarded(self, error: Exception) -> Event:
        """What the loop would do without trainguard: clip as configured; the step goes ahead.
        Returns the step's `monitor_error`. The same failure on step after step is recorded
        once, and once more saying how often it recurred when another failure comes or the run
        closes: not one event per step flooding the store."""
        text = f"{type(error).__name__}: {error}"
        event = Event(kind="monitor_error", step=self.state.step, severity="warning",
                      message=f"trainguard could not check this step ({text}); it was applied "
                              f"unguarded")
        last = self._monitor_error
        if last is not None and last[0] == text:
            self._monitor_error = (text, last[1], last[2] + 1, self.state.step)
        else:
            self._report_repeats()
            self._monitor_error = (text, self.state.step, 0, self.state.step)
            log.error("trainguard: %s", event.message)
            self.emit_event(event)
        try:
            params = [p for p in self.watched.params if p.grad is not None]
            limit = self.state.clip_limit()
            if limit is not None and params:
                torch.nn.utils.clip_grad_norm_(params, limit)
        except Exception as exc:  # the optimizer step still runs
            log.error("trainguard: clipping failed too (%s: %s)", type(exc).__name__, exc)
        self.state.step += 1
        self.schedule_sampling()
        return event

    def _report_repeats(self) -> None:
        last = self._monitor_error
        if last is None or not last[2]:
            return
        text, first, repeats, until = last
        self._monitor_error = (text, until, 0, until)
        event = Event(kind="monitor_error", step=until, severity="warning",
                      message=f"the failure of step {first} ({text}) recurred on {repeats} more "
                              f"step(s), through step {until}; each was applied unguarded",
                      details={"repeats": repeats, "first_step": first})
        log.error("trainguard: %s", event.message)
        self.emit_event(event)

    def peer_lost(self, error: PeerLost) -> None:
        """A rank is gone (or the ranks fell out of step): record why and close the run as
        failed. No collective runs after this (the link refuses them)."""
        if self.closed:
            return
        self.emit_event(Event(
            kind="peer_lost", step=self.state.step, severity="error", message=str(error),
            details={"ranks": error.ranks, "rank": self.dist.rank if self.dist else 0}))
        self.close(status="failed")

    def raise_if_peer_lost(self) -> None:
        """Steps after a lost peer fail with the same error, not with "trainguard is closed"."""
        if self.dist is not None and self.dist.link.lost is not None:
            raise self.dist.link.lost

    # -- diagnosis, state, shutdown --------------------------------------------------------------
    def evidence_findings(self, step_findings: Iterable[Finding] = ()) -> list[Finding]:
        """The findings a diagnosis weighs: the run's, those of the step under way (not yet
        recorded), and the runs of consecutive bad batches seen so far (added to the run's
        findings when it closes)."""
        if self.closed:
            return list(self.findings)
        return self.findings + list(step_findings) + self.batches.run_findings()

    def diagnose(self) -> list[RankedCause]:
        try:
            return rank_causes(self.events, self.evidence_findings())
        except Exception as exc:  # diagnosis is best effort
            log.error("trainguard: diagnosis failed (%s: %s)", type(exc).__name__, exc)
            return []

    def state_dict(self) -> dict[str, Any]:
        return portable(self.state.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.load_state_dict(state)
        if self.state.recovery is not None:
            self.state.recovery.restart(self.state.step, self.state.rewind_state())
        self.schedule_sampling()

    def close(self, status: Status = "finished") -> list[RankedCause]:
        """Flush the last measurements, tell the sinks the diagnosis and the final status, and
        close them. Returns the diagnosis."""
        if self.closed:
            return []
        with lifecycle.closing():  # a signal meanwhile waits: no run is left half closed
            return self._close(status)

    def _close(self, status: Status) -> list[RankedCause]:
        self.closed = True
        self._report_repeats()
        if self._lifecycle is not None:
            lifecycle.untrack(self._lifecycle)
        if self.activation_probe is not None and self.activation_probe.attached:
            self.activation_probe.detach()
        if self.output_probe is not None and self.output_probe.attached:
            self.output_probe.detach()
        try:
            self._flush_pending()
        except Exception as exc:  # the last sampled statistics are lost, nothing else
            log.error("trainguard: could not flush the last measurements (%s: %s)",
                      type(exc).__name__, exc)
        self.add_findings(self.batches.run_findings())
        self._settle_warmup()
        diagnosis = self.diagnose()
        if diagnosis:
            self.sinks.on_diagnosis(diagnosis)
        try:
            self.verdict = self.state.losses.verdict(
                halted=self.halted or status == "halted")
        except Exception as exc:  # the verdict is advisory
            log.error("trainguard: no verdict (%s: %s)", type(exc).__name__, exc)
        if self.verdict is not None:
            self.sinks.on_verdict(self.verdict)
        self.sinks.on_run_end(status)
        self.sinks.close()
        return diagnosis

    # -- internals -------------------------------------------------------------------------------
    def _open_store(self, resume: bool) -> RunStoreSink | None:
        if self.run_dir is None or not self.config.store:
            return None
        try:
            return RunStoreSink(self.run_dir, resume=resume)
        except StoreUnavailable as exc:  # the README's promise: training goes on without it
            log.warning("trainguard: %s; training goes on without the run store", exc)
            return None

    def _run_preflight(self) -> None:
        try:
            findings = preflight(self.model, self.optimizer, self.scheduler, scaler=self.scaler,
                                 max_grad_norm=self.state.clip_limit(), clipping_known=True)
        except Exception as exc:  # an audit bug must not stop training
            log.error("trainguard: preflight audit failed (%s: %s)", type(exc).__name__, exc)
            return
        # the loop may warm the LR up itself: "no warmup" waits for the LRs the steps use
        if any(f.check == "warmup" for f in findings):
            self.warmup_watch = WarmupWatch(RunSetup(
                model=self.model, optimizers=[self.optimizer], scheduler=self.scheduler))
            findings = [f for f in findings if f.check != "warmup"]
        self.findings.extend(findings)
        self.sinks.on_findings(list(self.findings))

    def _settle_warmup(self) -> None:
        """A run that ended within the warmup watch: judged on the steps it had."""
        watch, self.warmup_watch = self.warmup_watch, None
        if watch is None:
            return
        try:
            self.add_findings(watch.settle())
        except Exception as exc:  # advisory
            log.error("trainguard: warmup check failed (%s: %s)", type(exc).__name__, exc)

    def _flush_pending(self) -> None:
        """Bring the last heavy-probe results to the host (one transfer) and record them."""
        pending, self.steps.queued = self.steps.queued, []
        signals = flush_pending(self, pending)
        if signals is None:
            return
        for event in run_detectors(self.state.detectors, signals, sampled_only=True):
            self.emit_event(event)
        self.sinks.on_sampled(signals.sampled)


def _closer(run: Run) -> Callable[[Status], None]:
    """Closes the run if the process ends (SIGTERM, Ctrl-C, exit) before `close()`; holds the run
    weakly, so an abandoned run can still be collected."""
    ref = weakref.ref(run)

    def close(status: Status) -> None:
        alive = ref()
        if alive is not None:
            alive.close(status=status)

    return close


def _on_lost(run: Run) -> Callable[[PeerLost], None]:
    """`Run.peer_lost`, holding the run weakly (the link lives as long as the run's context)."""
    ref = weakref.ref(run)

    def lost(error: PeerLost) -> None:
        alive = ref()
        if alive is not None:
            alive.peer_lost(error)

    return lost


def _scaler_enabled(scaler: Any) -> bool:
    is_enabled = getattr(scaler, "is_enabled", None)
    return bool(is_enabled()) if callable(is_enabled) else True


def _auto_clip(config: GuardConfig) -> RobustClipLimit | None:
    """The adaptive default clip, on the detectors' baseline window, warm-up and absolute limit."""
    if not config.adaptive_clip:
        return None
    d = config.detectors
    return RobustClipLimit(window=d.baseline_window, warmup_steps=max(d.warmup_steps, 1),
                           ceiling=d.grad_norm_abs_threshold, min_log_scale=d.min_log_scale,
                           **config.auto_clip_options())


def _run_dir(run_dir: object) -> Path | None:
    """The run directory, or one clear error: an empty string would write into the current
    directory, a number is no path."""
    if run_dir is None:
        return None
    if not isinstance(run_dir, (str, Path)):
        raise UsageError(f"run_dir must be a path (str or pathlib.Path) or None, got "
                         f"{type(run_dir).__name__} {run_dir!r}")
    if not str(run_dir).strip():
        raise UsageError("run_dir is empty; give a directory such as 'runs/exp1' (or None to "
                         "keep no run store)")
    return Path(run_dir)
