"""The recipe tests use tiny models that gain nothing from a second thread and slow down badly
when two threads compete for a busy CPU: run them on one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..conftest import torch_threads


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield
