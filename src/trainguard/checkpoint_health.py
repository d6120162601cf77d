"""Marking a checkpoint with the run's health, and the Guard's state saved beside it.

    torch.save({...}, "ckpt/step30.pt")
    trainguard.mark_checkpoint("ckpt/step30.pt", guard)      # or guard.checkpoint_health(path)
    ...
    path = trainguard.last_healthy_checkpoint("ckpt")         # after a crash
    trainguard.resume_guard(path, guard)                      # baselines, skip list, LR backoff

`mark_checkpoint` checks on the device that every weight and optimizer moment is finite (one
`torch._foreach_norm` per device and dtype, summed, one host transfer for both),
saves the Guard's `state_dict` to the companion `trainguard_state.pt`, and writes the sidecar
last (`checkpoints.py`), each atomically. A checkpoint with anything non-finite is marked
`poisoned` under every policy, with an event and a warning naming it, and renamed
`<name>.poisoned` when `GuardConfig.blocks_poisoned_checkpoints`. Nothing here stops training:
a failure is logged and the checkpoint is left without a sidecar.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from trainguard.checkpoints import (
    POISONED_SUFFIX,
    CheckpointHealth,
    Health,
    clean_temps,
    content_fingerprint,
    forget,
    open_temp,
    sidecar_path,
    state_path,
    write_json_atomic,
)
from trainguard.errors import UsageError
from trainguard.events import Event, at_least
from trainguard.finiteness import finite_state
from trainguard.pipeline.run import Run
from trainguard.registry import Kind
from trainguard.version import __version__
from trainguard.vocabulary import DEGRADED

log = logging.getLogger("trainguard")

INCIDENT_QUIET_STEPS = 10
"""A run is inside an incident from an error-level event until this many steps pass without
one: a checkpoint saved meanwhile is `incident`, not `healthy`."""
_OWN_KINDS = (Kind.POISONED_CHECKPOINT,)


# -- the run's health ----------------------------------------------------------------------------
def run_health(run: Run, step: int) -> tuple[Health, list[dict[str, Any]], str | None]:
    """The run's health at `step`, the open events of its incident, and its verdict so far."""
    serious = [e for e in run.events if at_least(e.severity, "error") and e.kind not in _OWN_KINDS
               and 0 <= step - e.step <= INCIDENT_QUIET_STEPS]
    health: Health = "healthy"
    if serious:
        health = "incident"
    elif any(e.kind == Kind.ROLLBACK for e in run.events):
        health = "recovered"
    verdict = None
    with contextlib.suppress(Exception):  # the verdict is advisory
        judged = run.state.losses.verdict(halted=run.halted, halt_step=run.halt_step,
                                          unjudged=run.unjudged())
        verdict = judged.verdict if judged is not None else None
    return health, [{"kind": e.kind, "step": e.step, "severity": e.severity}
                    for e in serious[-20:]], verdict


# -- the companion state file --------------------------------------------------------------------
def save_state(path: Path, state: dict[str, Any]) -> None:
    """`torch.save` to a hidden temporary file beside `path` (with the umask's permissions),
    then rename it over `path`."""
    fd, tmp = open_temp(path)
    try:
        with open(fd, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_guard_state(checkpoint: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The Guard's state saved with a checkpoint (None when it has none), loaded with
    `weights_only=True`."""
    path = state_path(checkpoint)
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise UsageError(f"{path} does not hold a trainguard state")
    return state


def resume_guard(checkpoint: str | os.PathLike[str], guard: Any) -> bool:
    """Give a Guard (or a framework callback, before training begins) the state saved with
    `checkpoint`: its baselines, the recover policy's skip list and LR backoff, the clip limit
    in force, so a resumed run does not relapse on the same data. False when the checkpoint
    has no saved state."""
    state = load_guard_state(checkpoint)
    if state is None:
        return False
    guard.load_state_dict(state)
    return True


# -- marking -------------------------------------------------------------------------------------
def run_of(guard: Any) -> Run:
    """The `Run` of a Guard, a framework callback (once training began) or a Run."""
    run = guard if isinstance(guard, Run) else getattr(guard, "run", None)
    if not isinstance(run, Run):
        raise UsageError("mark_checkpoint needs a trainguard.Guard, or a trainguard callback "
                         "whose training has begun")
    return run


def mark_checkpoint(checkpoint: str | os.PathLike[str], guard: Any, *,
                    step: int | None = None) -> CheckpointHealth | None:
    """Write the sidecar of a checkpoint just saved (a folder or a file), with the Guard's state
    beside it. `step`: the step the checkpoint holds (default: the steps the Guard took).
    Returns what the sidecar says, or None when nothing was written (not rank 0, or the write
    failed: logged, training goes on)."""
    try:
        run = run_of(guard)
        if not run.is_main:
            return None
        return _mark(run, Path(checkpoint), run.state.step if step is None else int(step))
    except Exception as exc:  # a checkpoint's health is advisory: never the cause of a failure
        log.error("trainguard: could not write the health of checkpoint %s (%s: %s); "
                  "training goes on", checkpoint, type(exc).__name__, exc)
        return None


def current_health(guard: Any, step: int | None = None) -> CheckpointHealth:
    """What a sidecar written now would say (the finiteness check included), without writing
    anything."""
    run = run_of(guard)
    step = run.state.step if step is None else int(step)
    weights, moments = finite_state(run.watched.params, run.optimizer)
    health, open_events, verdict = run_health(run, step)
    if weights is False or moments is False:  # whatever the losses said so far
        verdict = DEGRADED
    return CheckpointHealth(step=step, health=health, weights_finite=weights,
                            optimizer_finite=moments, policy=run.config.policy,
                            verdict=verdict, open_events=open_events, saved_at=time.time(),
                            trainguard_version=__version__)


def _mark(run: Run, path: Path, step: int) -> CheckpointHealth:
    if not path.exists():
        raise UsageError(f"{path} does not exist: save the checkpoint, then mark it")
    forget(path)  # until the new sidecar is written, the checkpoint has none (not an old one)
    clean_temps(path if path.is_dir() else path.parent)
    record = current_health(run, step)
    if record.poisoned and run.config.blocks_poisoned_checkpoints:
        path = _block(path)
        record.blocked = True
    save_state(state_path(path), run.state_dict())
    record.state_file = state_path(path).name
    record.content = content_fingerprint(path)
    write_json_atomic(sidecar_path(path), record.to_dict())
    if record.poisoned:
        _warn(run, path, record)
    return record


def _block(path: Path) -> Path:
    """Rename a poisoned checkpoint `<name>.poisoned` (replacing an older one of that name)."""
    target = path.with_name(path.name + POISONED_SUFFIX)
    if target.is_dir():
        shutil.rmtree(target)
    elif path.is_file():
        for old in (target, sidecar_path(target), state_path(target), state_path(path)):
            old.unlink(missing_ok=True)
    os.replace(path, target)
    return target


def _warn(run: Run, path: Path, record: CheckpointHealth) -> None:
    what = " and ".join(name for name, finite in (("weights", record.weights_finite),
                                                   ("optimizer moments", record.optimizer_finite))
                        if finite is False)
    where = ("renamed so that no resume picks it" if record.blocked else
             "resume from trainguard.last_healthy_checkpoint(), not from this one")
    message = (f"checkpoint {path} (step {record.step}) was saved with non-finite {what}: "
               f"marked poisoned; {where}")
    if run.closed or not run.config.sinks.console:
        log.warning("trainguard: %s", message)
    if not run.closed:
        run.emit_event(Event(kind="poisoned_checkpoint", step=record.step, severity="error",
                             message=message, details={"checkpoint": str(path),
                                                       "blocked": record.blocked}))
