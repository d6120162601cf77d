"""Shared fixtures: real small models trained on structured synthetic data."""

from __future__ import annotations

import os

# OpenMP threads that spin while they wait for work hold a core they do not use: on a busy
# machine with few cores, two-thread torch ran the tests that train several times slower than
# with waiting threads that sleep. Set before torch is first imported (OpenMP reads it when it
# loads), so the test processes and every process they start inherit it; a value given in the
# environment is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# One intra-op thread: the tests' models are small enough that a second thread costs more in
# hand-offs than it computes, and the tests that start two ranks would put four threads on two
# cores (six scenario tests of the observe identity check took 46 s this way, 53 s with two).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch

from trainguard.demo import MarkovLanguage, TinyCausalLM
from trainguard.events import ActionRecord
from trainguard.sinks import Sink

from .tracker_runs import mlflow_store, mlflow_uri, wandb_offline  # noqa: F401  (fixtures)


@dataclass
class Setup:
    model: TinyCausalLM
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    language: MarkovLanguage

    def batch(self, size: int = 8, length: int = 17) -> torch.Tensor:
        return self.language.batch(size, length)


def make_setup(lr: float = 3e-3, warmup: int = 20, total: int = 300, seed: int = 0,
               d_model: int = 32) -> Setup:
    torch.manual_seed(seed)
    language = MarkovLanguage(vocab_size=32, seed=seed)
    model = TinyCausalLM(vocab_size=32, d_model=d_model, n_layer=2, n_head=2, max_len=32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    scheduler = None
    if warmup:
        def schedule(step: int) -> float:
            return min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(step, total)
                                                                       / total))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    return Setup(model, optimizer, scheduler, language)


@pytest.fixture
def setup_factory() -> Callable[..., Setup]:
    return make_setup


@pytest.fixture
def quiet_log() -> Iterator[None]:
    """trainguard's log at CRITICAL for the test: runs that roll back print their events."""
    logger = logging.getLogger("trainguard")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


# -- schedules, for tests of code that rewinds or rescales them --------------------------------
def lambda_setup() -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([param], lr=0.1)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 / (1 + s))


def advance(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
            ) -> None:
    optimizer.step()  # no gradients: changes nothing, but keeps the scheduler's order check quiet
    scheduler.step()


def lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    return [float(g["lr"]) for g in optimizer.param_groups]


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run a block with `count` torch threads (tiny models gain nothing from more, and slow down
    badly when threads compete for a busy CPU), then restore the previous count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class Actions(Sink):
    """A sink that keeps the actions it hears (skips, rollbacks, checkpoints kept, ...)."""

    def __init__(self) -> None:
        self.actions: list[ActionRecord] = []

    def on_action(self, action: ActionRecord) -> None:
        self.actions.append(action)
