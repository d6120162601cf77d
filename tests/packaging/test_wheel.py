"""The built wheel, not the checkout, installs and runs: a package file left out of the wheel
fails here. The wheel is built with `pip wheel` (setuptools, as `python -m build` would), installed
with `--no-deps` into a fresh venv that borrows only this environment's third-party packages
(torch, numpy, rich), and runs `trainguard demo` in its quick form and `trainguard show`."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def run(*cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, f"{cmd}: {result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


def test_the_wheel_installs_and_runs_the_demo(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", dist,
        ROOT)
    [wheel] = dist.glob("trainguard-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "trainguard/py.typed" in names and "trainguard/cli.py" in names
    assert not [n for n in names if n.startswith("tests/")]

    # nothing of the checkout on the path: with PYTHONPATH=src, pip would find the egg-info the
    # build left there and call trainguard already installed
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, env=env)
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "--no-deps", "--no-index", wheel, env=env,
        cwd=tmp_path)
    # borrow torch, numpy and rich from this environment, after the venv's own packages (a
    # .pth line is a plain path entry: this environment's editable trainguard is not on it)
    purelib = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                       env=env).stdout.strip())
    here = {sysconfig.get_paths()["purelib"], *site.getsitepackages()}
    (purelib / "borrowed.pth").write_text("\n".join(sorted(here)) + "\n")
    where = run(python, "-c", "import trainguard; print(trainguard.__file__)", env=env,
                cwd=tmp_path).stdout
    assert str(venv) in where, "the wheel's trainguard, not the checkout's"
    trainguard = venv / "bin" / "trainguard"
    out = tmp_path / "demo"
    run(trainguard, "demo", "--steps", "40", "--out", out, env=env, cwd=tmp_path)
    shown = run(trainguard, "show", out / "healthy", env=env, cwd=tmp_path).stdout
    assert "status     finished" in shown
