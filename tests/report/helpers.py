"""Synthetic runs for the report tests, written through trainguard's own store writer, and a
headless Chromium to open the reports in."""

from __future__ import annotations

import base64
import json
import math
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trainguard
from trainguard.events import ActionRecord, Event
from trainguard.store import RunStore

HOSTILE = ("</script><script>document.documentElement.dataset.pwned='script'</script>"
           "<img src=x onerror=\"document.documentElement.dataset.pwned='img'\"><!--")
"""A string that breaks out of a script element (or opens a comment) and runs code if it is not
escaped; the code marks the page's root element `data-pwned`."""


@dataclass
class Synthetic:
    run_dir: Path
    steps: int
    names: list[str]
    modules: list[str]
    spike_step: int
    spike_value: float
    nan_step: int
    inf_step: int
    skipped: list[int]
    rollback_step: int
    rollback_to: int
    events: list[Event] = field(default_factory=list)


def write_run(run_dir: Path, *, steps: int = 300, params: int = 6, modules: int = 4,
              sample_every: int = 10, events: int = 3, names: list[str] | None = None,
              module_names: list[str] | None = None, text: str = "",
              seed: int = 0) -> Synthetic:
    """A recover-policy run with a loss spike, a NaN loss and an inf loss (both skipped), a
    rollback, sampled per-parameter and per-module metrics, and `events` loss spikes more.
    `text` is appended to every string the run records (messages, fixes, config values)."""
    rng = np.random.default_rng(seed)
    names = names or [f"layers.{i // 2}.{'weight' if i % 2 == 0 else 'bias'}"
                      for i in range(params)]
    module_names = module_names or [f"layers.{i}" for i in range(modules)]
    spike, nan_step, inf_step = steps // 3, steps // 2, steps // 2 + 7
    rollback_step, rollback_to = (3 * steps) // 4, (3 * steps) // 4 - 5
    run = Synthetic(run_dir, steps, list(names), list(module_names), spike, 50.0, nan_step,
                    inf_step, [nan_step, inf_step], rollback_step, rollback_to)
    store = RunStore(run_dir)
    store.put_meta("trainguard_version", trainguard.__version__)
    store.put_meta("config", {"policy": "recover" + text, "max_grad_norm": 1.0,
                              "note": text})
    store.put_meta("param_names", list(names))
    store.put_meta("param_shapes", [[8, 8]] * len(names))
    store.put_meta("preflight", [
        {"check": "warmup" + text, "severity": "warning", "message": "no warmup" + text,
         "fix": "add warmup" + text, "cause": "missing_warmup", "evidence": {"why": text}},
        {"check": "mode_and_lr", "severity": "info", "message": "LR fine", "fix": "",
         "cause": None, "evidence": {}}])
    extra = sorted(rng.choice(np.arange(1, steps), size=min(events, steps - 1), replace=False))
    planned: dict[int, list[Event]] = {}
    for step in extra:
        planned.setdefault(int(step), []).append(
            Event("grad_explosion", int(step), "warning", f"gradient norm jumped{text}",
                  param=names[int(step) % len(names)], value=12.5))
    planned.setdefault(spike, []).append(
        Event("loss_spike", spike, "warning", f"loss jumped to 50{text}", value=50.0))
    planned.setdefault(nan_step, []).append(
        Event("nonfinite_loss", nan_step, "error", f"the loss is NaN{text}", value=math.nan))
    planned.setdefault(inf_step, []).append(
        Event("nonfinite_loss", inf_step, "error", f"the loss is inf{text}", value=math.inf))
    planned.setdefault(rollback_step, []).append(
        Event("rollback", rollback_step, "warning", f"rolled back to step {rollback_to}{text}",
              value=float(rollback_to), details={"to_step": rollback_to, "max_grad_norm": 0.5}))
    base = rng.lognormal(-1.0, 0.5, size=len(names)) / math.sqrt(len(names))
    for step in range(steps):
        loss = 3.0 * math.exp(-step / max(1, steps / 5)) + 0.5 + 0.05 * rng.standard_normal()
        grads = (base * rng.lognormal(0.0, 0.3, size=len(names))).astype(np.float32)
        action = "applied"
        if step == spike:
            loss = run.spike_value
            grads[0] = 1e4
        if step == nan_step:
            loss = math.nan
            grads[1 % len(names)] = np.nan
        if step == inf_step:
            loss = math.inf
            grads[2 % len(names)] = np.inf
        if step in (nan_step, inf_step):
            action = "skipped"
            store.put_action(ActionRecord("skip", step, f"skipped the update{text}"))
        if step == rollback_step:
            action = "rolled_back"
            store.put_action(ActionRecord("rollback", step, f"rolled back{text}",
                                          {"to_step": rollback_to, "why": text}))
        norm = float(np.sqrt(np.sum(grads.astype(np.float64) ** 2)))
        coef = 1.0 / norm if math.isfinite(norm) and norm > 1.0 else 1.0
        if action == "applied" and coef < 1.0:
            action = "clipped"
        for event in planned.get(step, []):
            store.put_event(event)
            run.events.append(event)
        store.put_step(step, {"loss": loss, "grad_norm": norm, "lr": 1e-3 * (1 - step / steps),
                              "action": action, "clip_coef": coef,
                              "sampled": step % sample_every == 0}, grads)
        if step % sample_every == 0:
            ratio = grads / 1e3
            if step == nan_step - nan_step % sample_every:
                ratio = ratio.copy()
                ratio[0] = np.nan
            store.put_param_metrics(step, {"update_ratio": ratio,
                                           "weight_maxabs": base * 10 + step / steps,
                                           "weight_std": base + 0.01})
            zero = rng.random(len(module_names)).astype(np.float32) * 0.5
            store.put_module_metrics(step, list(module_names), {
                "act_zero_frac": zero, "act_dead_frac": zero / 2,
                "act_maxabs": rng.lognormal(1.0, 0.5, len(module_names))})
        if step % 5000 == 4999:
            store.flush(timeout=60)  # the writer's queue holds 10k records: let it drain
    store.put_meta("diagnosis", [{"code": "lr_too_high" + text, "confidence": 0.6, "score": 2.0,
                                  "evidence": [f"loss spiked at step {spike}{text}"],
                                  "fix": "lower the LR" + text}])
    store.put_meta("verdict", {"verdict": "recovered", "message": "back on track" + text,
                               "start": 3.5, "before_trouble": 0.9, "final": 0.6,
                               "trouble_step": spike})
    store.set_status("finished")
    store.close()
    assert store.dropped == 0 and store.failed is None
    return run


# -- the report's own data -------------------------------------------------------------------
def payload(html: str) -> dict[str, Any]:
    """The figures and arrays embedded in a report."""
    found = re.search(r'<script type="application/json" id="tg-data">(.*?)</script>', html,
                      re.S)
    assert found, "the report embeds its data"
    return json.loads(found.group(1))


# -- Chromium ------------------------------------------------------------------------------------
def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


NO_CHROMIUM = ("no chromium binary on PATH (`make test` installs Debian's chromium when run as "
               "root: apt-get install -y chromium)")


def require_chromium() -> str:
    path = chromium_binary()
    if path is None:
        pytest.skip(NO_CHROMIUM)
    return path


@dataclass
class Opened:
    dom: str
    seconds: float
    stderr: str
    status: dict[str, str]
    """The attributes of the report's #tg-status element, and its "text"."""


def open_in_chromium(page: Path, *, budget_ms: int = 30000, timeout: float = 240,
                     screenshot: Path | None = None,
                     window: tuple[int, int] = (1300, 2000)) -> Opened:
    binary = require_chromium()
    with tempfile.TemporaryDirectory(prefix="tg-chromium-") as profile:
        command = [binary, "--headless", "--no-sandbox", "--disable-gpu",
                   "--disable-background-networking", "--disable-component-update",
                   "--disable-sync", "--no-first-run", "--disable-extensions",
                   f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
                   f"--virtual-time-budget={budget_ms}",
                   f"--window-size={window[0]},{window[1]}"]
        if screenshot is not None:
            command += ["--hide-scrollbars", f"--screenshot={screenshot}"]
        else:
            command.append("--dump-dom")
        started = time.perf_counter()
        result = subprocess.run([*command, page.resolve().as_uri()], capture_output=True,
                                text=True, timeout=timeout)
        seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stderr[-2000:]
    status: dict[str, str] = {}
    found = re.search(r'<div id="tg-status"([^>]*)>([^<]*)</div>', result.stdout)
    if found:
        status = dict(re.findall(r'([\w-]+)="([^"]*)"', found.group(1)))
        status["text"] = found.group(2)
    return Opened(result.stdout, seconds, result.stderr, status)


def console_messages(stderr: str) -> list[str]:
    """What the page wrote to the console, uncaught errors and content-policy refusals
    included (Chromium logs them all as CONSOLE lines, whatever their level)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def grid_codes(spec: dict[str, Any]) -> np.ndarray:
    """The int16 codes of a heat map grid in the page's data (see `trainguard.report.encode`)."""
    codes = np.frombuffer(base64.b64decode(spec["b64"]), dtype="<i2")
    return codes.reshape(spec["rows"], spec["cols"])


def decoded(spec: dict[str, Any]) -> np.ndarray:
    """A base64 array of the page's data ({"tg": "f8" | "i4"})."""
    dtype = {"f8": "<f8", "i4": "<i4"}[spec["tg"]]
    return np.frombuffer(base64.b64decode(spec["b64"]), dtype=dtype)
