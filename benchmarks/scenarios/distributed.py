"""Run a distributed scenario on several local processes with torch.distributed (gloo).

Each rank is a process with one torch thread, forked from a forkserver that has imported torch
and the scenario's module once. It joins a gloo process group over 127.0.0.1, builds the
scenario's workload (the workload wraps its model in DistributedDataParallel and picks its own
data shard from `rank_and_world()`), and runs the same step loop as `runner.run_scenario` with
its own stepper from `strategies.make_stepper`. Every rank has its own Guard; under the process
group they agree on the step's signals with one all-reduce per step (`trainguard.distributed`), so
they take the same decisions, and they compare weight fingerprints every `distributed.desync_every`
steps.

Besides training, every rank takes part in a few collectives of its own that never touch the
model:

- a one-element all-reduce after every step, so that when one rank halts (or fails in its
  optimizer step) the others stop at the same step instead of waiting in the next gradient
  all-reduce;
- every `DRIFT_EVERY` steps and at the end, the largest difference between the ranks' copies of
  any parameter (`replica_drift`). Replicas that DDP keeps in sync stay at 0; a desync shows as a
  difference that grows from 0.

Rank 0's result is returned, as in a single-process run (its `seconds` include the start of the
processes); the notes add every rank's eval loss, parameter checksum, events and actions, and the
drift over time. A rank that fails inside its forward or backward pass leaves the others in the
gradient all-reduce, as in a real job: gloo reports the mismatch and the run is recorded as
crashed.

A distributed scenario's `build` is pickled into the worker processes, so it must be a
module-level function or a `functools.partial` of one.
"""

from __future__ import annotations

import dataclasses
import math
import os
import queue
import socket
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from trainguard import GuardConfig, TrainingDiverged

from .base import Scenario
from .runner import RunResult, one_step
from .strategies import make_stepper

WORLD_SIZE = 2
DRIFT_EVERY = 10
"""Steps between two measurements of the parameter difference between ranks."""
COLLECTIVE_TIMEOUT_S = 60
"""How long a rank waits in a collective for a peer that is gone before it fails."""
RUN_TIMEOUT_S = 300
"""How long the parent waits for the ranks' results before it kills them."""


# -- helpers for workloads ---------------------------------------------------------------------
def rank_and_world() -> tuple[int, int]:
    """This process's rank and the world size; (0, 1) outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@contextmanager
def rank_zero_first() -> Iterator[None]:
    """Let rank 0 run the block before the other ranks (to fill a cache once, for example)."""
    rank, world = rank_and_world()
    if world > 1 and rank != 0:
        dist.barrier()
    yield
    if world > 1 and rank == 0:
        dist.barrier()


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DistributedDataParallel wrapper (or the model itself)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def replica_drift(model: nn.Module) -> float:
    """Largest |difference| between the ranks' copies of any parameter (0 when in sync).

    A collective: every rank must call it at the same point.
    """
    flat = torch.cat([p.detach().reshape(-1).double() for p in unwrap(model).parameters()])
    high, low = flat.clone(), flat.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    return float((high - low).max())


def param_checksum(model: nn.Module) -> float:
    """Sum of every parameter, in float64: equal on ranks whose replicas agree."""
    return float(sum(p.detach().double().sum() for p in unwrap(model).parameters()))


# -- the parent ----------------------------------------------------------------------------------
def run_distributed(scenario: Scenario, strategy: str = "trainguard", *,
                    config: GuardConfig | None = None, seed: int = 0,
                    steps: int | None = None) -> RunResult:
    """Run `scenario` on WORLD_SIZE local processes and return rank 0's result (not scored)."""
    total = steps if steps is not None else scenario.steps
    started = time.perf_counter()
    context = _context(getattr(scenario.build, "func", scenario.build).__module__)
    results: Any = context.Queue()
    port = _free_port()
    workers = [context.Process(target=_worker, daemon=True,
                               args=(rank, WORLD_SIZE, port, scenario, strategy, config, seed,
                                     total, results))
               for rank in range(WORLD_SIZE)]
    for worker in workers:
        worker.start()
    by_rank: dict[int, Any] = {}
    deadline = time.monotonic() + RUN_TIMEOUT_S
    timed_out = False
    try:
        while len(by_rank) < WORLD_SIZE and time.monotonic() < deadline:
            try:
                rank, payload = results.get(timeout=1.0)
                by_rank[rank] = payload
            except queue.Empty:
                if any(not w.is_alive() and w.exitcode != 0 for w in workers):
                    break  # a rank died without reporting; the others cannot finish either
        timed_out = len(by_rank) < WORLD_SIZE and time.monotonic() >= deadline
    finally:
        # Ranks that have reported have nothing left to do but tear down their interpreters.
        grace = 1 if len(by_rank) == WORLD_SIZE else 10
        for worker in workers:
            worker.join(timeout=grace)
            if worker.is_alive():
                worker.kill()
                worker.join()
    result = by_rank.get(0)
    if not isinstance(result, RunResult):
        why = (result if isinstance(result, str)
               else f"no result within {RUN_TIMEOUT_S} s" if timed_out
               else f"rank 0 did not report (exit codes {[w.exitcode for w in workers]})")
        result = RunResult(scenario=scenario.name, family=scenario.family, cause=scenario.cause,
                           onset_step=scenario.onset_step, strategy=strategy, steps_run=0,
                           outcome="crashed", final_eval_loss=float("nan"), train_losses=[],
                           actions={}, events=[], seconds=0.0, error=why[:300])
    result.notes["ranks"] = [
        by_rank[r].notes.get("rank") if isinstance(by_rank.get(r), RunResult)
        else {"rank": r, "error": str(by_rank.get(r, "no report"))[:300]}
        for r in range(WORLD_SIZE)]
    sums = [r.get("param_checksum") for r in result.notes["ranks"]]
    if all(s is not None for s in sums):
        result.notes["param_checksum_spread"] = max(sums) - min(sums)
    result.notes.pop("rank", None)
    result.seconds = time.perf_counter() - started  # process start-up included
    return result


def _context(build_module: str) -> Any:
    """A forkserver that imports torch and the scenario modules once; every rank is a fork of it.

    Spawning would pay those imports (the families package imports every family, transformers
    included) in every rank of every run; forking the parent directly would copy its threads
    (OpenMP, a run store's writer) in whatever state they are in. The server starts on the first
    distributed run of this process and serves the later ones.
    """
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["torch", __name__, build_module])
    return context


def _free_port() -> int:
    # The kernel picks a free port; rank 0's store binds it again a moment later.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- one rank ------------------------------------------------------------------------------------
def _worker(rank: int, world: int, port: int, scenario: Scenario, strategy: str,
            config: GuardConfig | None, seed: int, steps: int, results: Any) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    payload: Any
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        payload = _run_rank(scenario, strategy, _rank_config(config, rank), seed, steps)
    except Exception:  # reported to the parent, which records the run as crashed
        payload = f"rank {rank}: " + traceback.format_exc(limit=3).strip().splitlines()[-1]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    results.put((rank, payload))


def _rank_config(config: GuardConfig | None, rank: int) -> GuardConfig:
    """The Guard configuration of one rank: its own crash-snapshot folder, so that ranks halting
    at the same step never write the same file."""
    config = config if config is not None else GuardConfig(sinks={"console": False})
    folder = Path(config.checkpoints.snapshot_dir or "trainguard_snapshots") / f"rank{rank}"
    return dataclasses.replace(config, checkpoints=dataclasses.replace(
        config.checkpoints, snapshot_dir=str(folder)))


_OUTCOME_CODES = {"finished": 0, "halted": 1, "crashed": 2}


def _worst_outcome(outcome: str) -> str:
    """The worst outcome over all ranks this step (a collective): one halt stops every rank."""
    value = torch.tensor([float(_OUTCOME_CODES[outcome])])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return {code: name for name, code in _OUTCOME_CODES.items()}[int(value.item())]


def _run_rank(scenario: Scenario, strategy: str, config: GuardConfig | None, seed: int,
              total: int) -> RunResult:
    """The step loop of runner.run_scenario, on one rank, plus the cross-rank bookkeeping."""
    rank, _ = rank_and_world()
    torch.manual_seed(seed)
    workload = scenario.build(seed)
    stepper = make_stepper(strategy, workload, config)
    losses: list[float] = []
    actions: dict[str, int] = {}
    drift: dict[int, float] = {0: replica_drift(workload.model)}
    outcome, error = "finished", ""
    started = time.perf_counter()
    step = 0
    try:
        for step in range(total):
            try:
                action, loss = one_step(workload, stepper, step)
                actions[action] = actions.get(action, 0) + 1
                losses.append(loss)
            except TrainingDiverged as exc:
                outcome, error = "halted", str(exc).splitlines()[0][:300]
                actions["halted"] = actions.get("halted", 0) + 1
            except Exception as exc:  # the outcome of a broken run, recorded rather than raised
                first_line = (str(exc).splitlines() or [""])[0][:300]
                outcome, error = "crashed", f"{type(exc).__name__}: {first_line}"
            worst = _worst_outcome(outcome)
            if worst != "finished":
                if outcome == "finished":
                    outcome, error = worst, f"another rank {worst} at step {step}"
                break
            if (step + 1) % DRIFT_EVERY == 0:
                drift[step + 1] = replica_drift(workload.model)
        else:
            step = total
    finally:
        stepper.close()
    drift[step] = replica_drift(workload.model)
    eval_loss = workload.evaluate(workload.model)
    if outcome == "finished" and not all(torch.isfinite(p).all()
                                         for p in workload.model.parameters()):
        outcome = "nan"
    notes = dict(workload.notes)
    notes["replica_drift"] = drift
    notes["rank"] = {"rank": rank, "outcome": outcome, "eval_loss": eval_loss,
                     "param_checksum": param_checksum(workload.model),
                     "events": len(stepper.events), "actions": actions}
    return RunResult(
        scenario=scenario.name, family=scenario.family, cause=scenario.cause,
        onset_step=scenario.onset_step, strategy=strategy, steps_run=step, outcome=outcome,
        final_eval_loss=eval_loss if math.isfinite(eval_loss) else float("nan"),
        train_losses=losses, actions=actions, events=[e.to_dict() for e in stepper.events],
        seconds=time.perf_counter() - started, error=error, notes=notes,
        diagnosis=stepper.diagnosis())
