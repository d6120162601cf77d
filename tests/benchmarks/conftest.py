"""Scenario models are too small to gain from a second thread, and results of chaotic runs depend
on the thread count: run them on one, as the suite's command does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..conftest import torch_threads


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield
