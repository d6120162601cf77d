"""Synthetic step signals for the detector tests: plain numbers, no model and no torch.

Shared by the test modules of this package.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import numpy as np

from trainguard.config import DetectorConfig
from trainguard.detect.base import Detector
from trainguard.events import Event
from trainguard.signals import SampledStats, StepSignals

NAMES = ["a.weight", "b.weight"]
SHARES = np.array([0.6, 0.8])
"""Per-parameter shares of the global norm (0.6² + 0.8² = 1): b.weight has the largest gradient."""
SEEDS = (0, 1, 2, 3, 4)
HEALTHY_STEPS = 500
NAN = math.nan
INF = math.inf

D = TypeVar("D", bound=Detector)


def signals(step: int, *, loss: float | None = 1.0, grad_norm: float = 1.0,
            param_grad_norm: Sequence[float] | np.ndarray | None = None,
            names: Sequence[str] = NAMES, **kwargs: Any) -> StepSignals:
    """One step's signals. Per-parameter norms default to `grad_norm` split over NAMES."""
    if param_grad_norm is None:
        param_grad_norm = (grad_norm * SHARES if len(names) == len(SHARES)
                           else np.full(len(names), grad_norm / math.sqrt(len(names))))
    return StepSignals(step=step, loss=loss, grad_norm=grad_norm,
                       param_grad_norm=np.asarray(param_grad_norm, dtype=np.float32),
                       param_names=list(names), **kwargs)


def loss_run(losses: Iterable[float], start: int = 0, **kwargs: Any) -> list[StepSignals]:
    return [signals(start + i, loss=float(x), **kwargs) for i, x in enumerate(losses)]


def norm_run(norms: Iterable[float], start: int = 0, **kwargs: Any) -> list[StepSignals]:
    return [signals(start + i, grad_norm=float(x), **kwargs) for i, x in enumerate(norms)]


def sampled_step(step: int, sample_step: int | None = None, *,
                 per_param: dict[str, Sequence[float]] | None = None,
                 module_names: Sequence[str] = (),
                 per_module: dict[str, Sequence[float]] | None = None,
                 names: Sequence[str] = NAMES, **kwargs: Any) -> StepSignals:
    """A step whose transfer carries heavy-probe results measured at `sample_step` (default the
    step before, as in a guarded run)."""
    stats = SampledStats(
        step=step - 1 if sample_step is None else sample_step,
        per_param={k: np.asarray(v, dtype=np.float32) for k, v in (per_param or {}).items()},
        module_names=list(module_names),
        per_module={k: np.asarray(v, dtype=np.float32) for k, v in (per_module or {}).items()})
    return signals(step, names=names, sampled=[stats], **kwargs)


def run(detector: Detector, steps: Iterable[StepSignals]) -> list[Event]:
    events: list[Event] = []
    for s in steps:
        found = detector.check(s)
        for event in found:
            assert event.kind == detector.kind
        events.extend(found)
    return events


def steps_of(events: Iterable[Event]) -> list[int]:
    return [e.step for e in events]


def healthy_losses(n: int, seed: int, *, start: float = 2.3, floor: float = 0.7,
                   tau: float = 120.0, noise: float = 0.1) -> np.ndarray:
    """A fine-tuning loss curve: exponential decline towards `floor` with log-normal noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    mean = floor + (start - floor) * np.exp(-t / tau)
    return mean * np.exp(rng.normal(0.0, noise, n))


def converged_to_noise(n: int, seed: int, *, start: float = 1.0, floor: float = 1e-14,
                       wobble: float = 1e-13) -> np.ndarray:
    """A regression that converged to float noise: an exponential decline from `start` to
    `floor` over the first half, then rounding, not training: a slow swell between `floor` / 10
    and `wobble` (10x its lowest, for tens of steps) with now and then one step 10x up."""
    rng = np.random.default_rng(seed)
    half = n // 2
    decline = start * (floor / start) ** (np.arange(half) / (half - 1))
    t = np.arange(n - half)
    swell = np.log(floor) + math.log(10) * np.sin(2 * math.pi * t / 150 + rng.uniform(0, 6))
    jumps = np.where(rng.random(n - half) < 0.02, math.log(10), 0.0)
    noise = np.exp(swell + jumps + rng.normal(0.0, 0.05, n - half))
    return np.concatenate([decline, noise])


def healthy_grad_norms(n: int, seed: int, *, level: float = 1.0, noise: float = 0.3) -> np.ndarray:
    """Gradient norms of a healthy run: high in the first steps, settling to `level`, a slow
    drift, log-normal noise and rare 1.5-3x bumps (a hard batch)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    trend = level * (1.0 + 2.0 * np.exp(-t / 30.0)) * np.exp(0.2 * np.sin(t / 80.0))
    bumps = np.where(rng.random(n) < 0.02, rng.uniform(1.5, 3.0, n), 1.0)
    return trend * bumps * np.exp(rng.normal(0.0, noise, n))


def restored(detector: D) -> D:
    """A new detector of the same type, loaded from the original's state through JSON."""
    state = json.loads(json.dumps(detector.state_dict(), allow_nan=True))
    clone = type(detector)(detector.config)
    clone.load_state_dict(state)
    return clone


def event_key(event: Event) -> str:
    """A comparable (NaN-safe) rendering of an event."""
    return json.dumps(event.to_dict(), sort_keys=True, allow_nan=True, default=repr)


def assert_same_decisions(a: Detector, b: Detector, steps: Sequence[StepSignals]) -> list[Event]:
    """Both detectors decide identically, step by step, on the same continuation."""
    events: list[Event] = []
    for s in steps:
        ea, eb = a.check(s), b.check(s)
        assert [event_key(e) for e in ea] == [event_key(e) for e in eb], f"step {s.step}"
        events.extend(ea)
    return events


def default_config(**overrides: Any) -> DetectorConfig:
    return DetectorConfig(**overrides)


def healthy_weight_stats(seed: int, n_params: int = len(NAMES)) -> dict[str, np.ndarray]:
    """What the weight and optimizer-state probes report for a healthy model."""
    rng = np.random.default_rng(seed)
    std = rng.uniform(0.01, 0.1, n_params)
    return {"weight_mean": rng.normal(0.0, 0.01, n_params), "weight_std": std,
            "weight_maxabs": std * rng.uniform(3.0, 6.0, n_params),
            "weight_nonfinite": np.zeros(n_params), "weight_norm": std * 30.0,
            "update_ratio": rng.uniform(1e-4, 1e-3, n_params),
            "optstate_exp_avg_norm": rng.uniform(1e-4, 1e-2, n_params),
            "optstate_exp_avg_maxabs": rng.uniform(1e-5, 1e-3, n_params),
            "optstate_exp_avg_sq_norm": rng.uniform(1e-9, 1e-6, n_params),
            "optstate_exp_avg_sq_maxabs": rng.uniform(1e-10, 1e-7, n_params)}


def healthy_sampled_run(n: int, seed: int, every: int = 50) -> list[StepSignals]:
    """A healthy run whose heavy probes (measured every `every` steps) arrive one step later."""
    losses = healthy_losses(n, seed)
    norms = healthy_grad_norms(n, seed)
    steps = []
    for i in range(n):
        if i > 0 and (i - 1) % every == 0:
            steps.append(sampled_step(i, per_param=healthy_weight_stats(seed * 10_000 + i),
                                      loss=float(losses[i]), grad_norm=float(norms[i])))
        else:
            steps.append(signals(i, loss=float(losses[i]), grad_norm=float(norms[i])))
    return steps
