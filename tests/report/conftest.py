"""Runs shared by the report tests (written once per session: the 100k-step one takes seconds)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import HOSTILE, Synthetic, write_run


@pytest.fixture(scope="session")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Synthetic:
    return write_run(tmp_path_factory.mktemp("report") / "small", steps=200, params=6,
                     modules=4, sample_every=10, events=3)


@pytest.fixture(scope="session")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> Synthetic:
    root = tmp_path_factory.mktemp("report") / 'run <b>"&amp;</b>'
    return write_run(root, steps=120, names=[f"w{HOSTILE}", "b</script>", "a&lt;b", "a<b",
                                             "esc\x1b[31m\u202e"],
                     module_names=[f"m{HOSTILE}", "<!--", "ok"], sample_every=10,
                     events=2, text=HOSTILE)


@pytest.fixture(scope="session")
def big_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synthetic]:
    """100k steps, 500 parameters, 100 modules sampled every 50 steps, 300 events more."""
    root = tmp_path_factory.mktemp("report-big")
    yield write_run(root / "big", steps=100_000, params=500, modules=100, sample_every=50,
                    events=300)
    shutil.rmtree(root, ignore_errors=True)  # about 400 MB


@pytest.fixture(scope="session")
def big_report(big_run: Synthetic, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainguard.report import write_report

    out = tmp_path_factory.mktemp("report-big-html") / "big.html"
    write_report(big_run.run_dir, out)
    return out
