"""Run a function on two real processes joined in a gloo process group over 127.0.0.1.

Each rank is forked from a forkserver that has imported torch, trainguard and the rank scenarios
once, so a run costs a fork and a process-group rendezvous, not two interpreter start-ups. Each
rank uses one torch thread. The function is called as `target(rank, world, *args)` and must be a
module-level function (it is pickled into the ranks); what it returns must pickle too.
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
COLLECTIVE_TIMEOUT_S = 30
"""A rank stuck in a collective (its peer gone or out of step) fails after this long."""
RUN_TIMEOUT_S = 90


class RankFailed(AssertionError):
    """A rank raised, died or did not report in time; the message says which and why."""


def run_ranks(target: Callable[..., Any], *args: Any, world: int = WORLD_SIZE,
              fail_fast: bool = False, dies: tuple[int, ...] = ()) -> list[Any]:
    """`target(rank, world, *args)` on `world` processes; their return values by rank.

    `fail_fast`: as torchrun does, the first rank that fails ends the others (which may be
    waiting in a collective for it). `dies`: ranks meant to die without a result (None)."""
    context = mp.get_context("forkserver")
    # torch._dynamo is what building the first optimizer imports (~2 s): pay it once, here.
    context.set_forkserver_preload(["torch", "torch._dynamo", "torch.distributed.fsdp",
                                    "trainguard", "tests.distributed.scenarios"])
    results: Any = context.Queue()
    port = _free_port()
    workers = [context.Process(target=_worker, args=(rank, world, port, target, args, results),
                               daemon=True) for rank in range(world)]
    for worker in workers:
        worker.start()
    by_rank: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while len(by_rank) < world - len(dies) and time.monotonic() < deadline:
            try:
                rank, ok, payload = results.get(timeout=0.5)
                by_rank[rank] = (ok, payload)
                if fail_fast and not ok:
                    for worker in workers:
                        worker.kill()
                    break
            except queue.Empty:
                if any(not w.is_alive() and w.exitcode != 0 for r, w in enumerate(workers)
                       if r not in dies):
                    break
    finally:
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.kill()
                worker.join()
    failures = [f"rank {r}: {by_rank[r][1]}" if r in by_rank and not by_rank[r][0]
                else f"rank {r}: no result (exit code {workers[r].exitcode})"
                for r in range(world)
                if r not in dies and (r not in by_rank or not by_rank[r][0])]
    if failures:
        raise RankFailed("\n".join(failures))
    return [by_rank[r][1] if r in by_rank else None for r in range(world)]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _worker(rank: int, world: int, port: int, target: Callable[..., Any], args: tuple,
            results: Any) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        results.put((rank, True, target(rank, world, *args)))
    except BaseException:  # reported to the parent, which fails the test with it
        results.put((rank, False, traceback.format_exc(limit=8)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
