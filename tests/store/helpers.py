"""Helpers for run store tests: step reports, child processes, and read-only directories that
hold even for root."""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trainguard
from trainguard.events import Event, RunInfo, StepReport
from trainguard.signals import SampledStats, StepSignals

SRC = Path(trainguard.__file__).resolve().parents[1]
PARAMS = ["embed.weight", "block.0.weight", "head.weight"]


def run_info(run_dir: str | Path | None = None, **overrides: Any) -> RunInfo:
    fields: dict[str, Any] = {
        "run_dir": None if run_dir is None else str(run_dir),
        "config": {"policy": "protect", "max_grad_norm": 1.0}, "param_names": list(PARAMS),
        "param_shapes": [[32, 8], [8, 8], [8, 32]], "trainguard_version": trainguard.__version__}
    fields.update(overrides)
    return RunInfo(**fields)


def step_report(step: int, loss: float | None = 2.0, *, grads: Iterable[float] | None = None,
                sampled: list[SampledStats] | None = None, signals: bool = True,
                action: str = "applied", events: list[Event] | None = None) -> StepReport:
    norms = np.array(list(grads) if grads is not None else [0.1, 0.2, 0.3], dtype=np.float64)
    grad_norm = float(np.sqrt((norms ** 2).sum()))
    sig = StepSignals(step=step, loss=loss, grad_norm=grad_norm, param_grad_norm=norms,
                      param_names=list(PARAMS), lr=1e-3, sampled=list(sampled or []))
    return StepReport(step=step, loss=loss, grad_norm=grad_norm, action=action,  # type: ignore[arg-type]
                      events=list(events or []), lr=1e-3, sampled=bool(sampled),
                      signals=sig if signals else None)


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC)}


def python(code: str, *args: str, timeout: float = 180,
           prefix: list[str] | None = None,
           preexec_fn: Callable[[], None] | None = None) -> subprocess.CompletedProcess:
    """Run a Python snippet in a child process with this trainguard importable."""
    command = [*(prefix or []), sys.executable, "-c", textwrap.dedent(code), *args]
    return subprocess.run(command, capture_output=True, text=True, env=child_env(),
                          timeout=timeout, preexec_fn=preexec_fn)


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True,
                          text=True, env=child_env(), timeout=timeout)


# -- read-only directories -----------------------------------------------------------------------
# Root ignores permission bits (CAP_DAC_OVERRIDE), so chmod alone makes nothing read-only for
# it. A child that drops those capabilities from its bounding set before exec, or runs as
# nobody, sees the bits like any user.
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH, _PR_CAPBSET_DROP = 1, 2, 24


def _drop_dac_capabilities() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def _become_nobody() -> None:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


def _ways() -> list[tuple[str, list[str], Callable[[], None] | None]]:
    if os.geteuid() != 0:
        return [("plain user", [], None)]
    ways: list[tuple[str, list[str], Callable[[], None] | None]] = []
    setpriv = shutil.which("setpriv")
    if setpriv:
        ways.append(("setpriv bounding set", [setpriv, "--bounding-set=-dac_override,"
                                              "-dac_read_search"], None))
    ways.append(("prctl bounding set", [], _drop_dac_capabilities))
    if setpriv:
        ways.append(("setpriv nobody", [setpriv, "--reuid=65534", "--regid=65534",
                                        "--clear-groups"], None))
    ways.append(("setuid nobody", [], _become_nobody))
    return ways


@functools.lru_cache(maxsize=1)
def _readonly_way() -> tuple[list[str], Callable[[], None] | None] | str:
    """A way to run children for which a chmod 0o555 directory is read-only, or why not."""
    probe_dir = Path(tempfile.mkdtemp(prefix="tg-ro-probe-"))
    try:
        probe_dir.chmod(0o555)
        code = f"""
            import numpy, sqlite3, trainguard.store
            try:
                open({str(probe_dir / 'x')!r}, 'w')
            except PermissionError:
                print('read-only')
        """
        tried = []
        for name, prefix, preexec in _ways():
            try:
                result = python(code, prefix=prefix, preexec_fn=preexec, timeout=120)
            except (OSError, subprocess.SubprocessError) as exc:
                tried.append(f"{name}: {exc}")
                continue
            if result.returncode == 0 and "read-only" in result.stdout:
                return prefix, preexec
            tried.append(f"{name}: {(result.stderr.strip().splitlines() or ['writable'])[-1]}")
        return "; ".join(tried)
    finally:
        probe_dir.chmod(0o755)
        shutil.rmtree(probe_dir, ignore_errors=True)


def readonly_python(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run a snippet in a child that cannot write chmod'ed directories (skip if impossible)."""
    way = _readonly_way()
    if isinstance(way, str):
        pytest.skip(f"no way to make a directory read-only for this user here ({way})")
    prefix, preexec = way
    return python(code, *args, prefix=prefix, preexec_fn=preexec)


def world_readable_dir(prefix: str) -> Path:
    """A fresh directory under the system temp dir that an unprivileged child can reach (the
    pytest tmp_path is private to its owner)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


def make_read_only(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(0o555 if stat.S_ISDIR(mode) else 0o444)


def make_writable(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(0o755 if stat.S_ISDIR(mode) else 0o644)


def listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}
