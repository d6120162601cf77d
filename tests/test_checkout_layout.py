"""The tests that look at file paths pass in a checkout folder named `trainguard`.

`git clone` names the folder after the repository, and a virtual environment made inside it puts
torch under `.../trainguard/.venv/lib/pythonX.Y/site-packages/torch`: a check that tells
trainguard's own code by a folder called `trainguard` in the path then takes torch's for ours.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PATH_SENSITIVE = (
    "tests/test_guard.py::test_one_device_to_host_transfer_per_step_and_no_item_calls",
)
"""Every test that tells trainguard's frames or files from others' by their path."""
TEST_FILES = ("__init__.py", "conftest.py", "tracker_runs.py", "test_guard.py")
"""What those tests need of `tests/`: the conftest imports the trackers' fixtures."""
CHILD = """
import sys
import pytest
import torch
assert torch.__file__.startswith({site!r}), torch.__file__  # torch from the checkout's venv
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *{tests!r}]))
"""


@pytest.mark.slow
def test_path_sensitive_checks_pass_in_a_checkout_named_trainguard(tmp_path: Path) -> None:
    checkout = tmp_path / "trainguard"
    shutil.copytree(ROOT / "src", checkout / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (checkout / "tests").mkdir()
    for name in TEST_FILES:
        shutil.copy(ROOT / "tests" / name, checkout / "tests" / name)
    shutil.copy(ROOT / "pyproject.toml", checkout / "pyproject.toml")
    # the venv a user makes in their clone, with the real torch in it
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = checkout / ".venv" / "lib" / version / "site-packages"
    site.mkdir(parents=True)
    (site / "torch").symlink_to(Path(torch.__file__).parent, target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(checkout / "src")])}
    result = subprocess.run(
        [sys.executable, "-c", CHILD.format(site=str(site), tests=list(PATH_SENSITIVE))],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
