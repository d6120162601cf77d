"""The integration tests train tiny models that gain nothing from a second thread and slow down
badly when two threads compete for a busy CPU: run them on one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..conftest import torch_threads


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


@pytest.fixture
def fresh_accelerate() -> Iterator[None]:
    """accelerate keeps its state in process-wide singletons: a test that builds an Accelerator
    starts and ends with a clean one, as accelerate's own test case class does."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
