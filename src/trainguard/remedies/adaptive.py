"""Adaptive global-norm clipping in the style of ZClip (Kumar et al. 2025).

The global gradient norm is compared with an exponential moving mean and variance of the norms
seen so far: a norm above `mean + z_threshold * std` is clipped to that threshold. The first
`warmup_steps` finite norms only build the statistics (their mean and variance start the EMA);
meanwhile the fixed `fallback_max_norm` applies. A clipped step updates the statistics with the
threshold it was clipped to, not with its raw norm, so one spike cannot drag the baseline up.

Why not the `zclip` package itself:

* One NaN step poisons it for good. zclip folds every norm into its warm-up buffer or EMA
  without checking it, so after a single NaN gradient its mean is NaN; every later z-score is NaN,
  `z > z_thresh` is False, and adaptive clipping is silently off for the rest of the run. Here a
  non-finite norm never touches the statistics and gets coefficient 1.0: the Guard skips that step.
* It recomputes the gradient norm (one `.norm()` per parameter and a `.item()` sync); this rule
  reuses the norm the Guard already measured and runs entirely on the host.
* zclip caps every step at `clip.max_grad_norm` as well; here the fixed limit is only the warm-up
  fallback. For both, compose: `chain(AdaptiveClip(), GlobalNormClip(1.0))`.

With finite norms the arithmetic equals zclip's `mode="percentile"` with `clip.max_grad_norm=None`
(same warm-up initialisation, same EMA update, same clip coefficient).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trainguard.errors import ConfigError, UsageError
from trainguard.remedies.rules import EPS, check_limit, check_norms, clip_factor


class AdaptiveClip:
    def __init__(self, z_threshold: float = 2.5, alpha: float = 0.97, warmup_steps: int = 25,
                 fallback_max_norm: float | None = 1.0) -> None:
        self.z_threshold = check_limit(z_threshold, "AdaptiveClip.z_threshold")
        if (not isinstance(alpha, (int, float)) or isinstance(alpha, bool)
                or not 0.0 < alpha < 1.0):
            raise ConfigError(f"AdaptiveClip.alpha: must be a number strictly between 0 and 1 "
                              f"(the EMA decay), got {alpha!r}")
        if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < 1:
            raise ConfigError(f"AdaptiveClip.warmup_steps: must be an integer >= 1, got "
                              f"{warmup_steps!r}")
        self.alpha = float(alpha)
        self.warmup_steps = warmup_steps
        self.fallback_max_norm = (None if fallback_max_norm is None else
                                  check_limit(fallback_max_norm, "AdaptiveClip.fallback_max_norm"))
        self._buffer: list[float] = []
        self.mean: float | None = None
        """EMA of the (clipped) global norm; None during warm-up."""
        self.var: float | None = None
        """EMA of its squared deviation; None during warm-up."""

    @property
    def warmed_up(self) -> bool:
        return self.mean is not None

    @property
    def threshold(self) -> float | None:
        """The norm above which the next step is clipped (None during warm-up)."""
        if self.mean is None or self.var is None:
            return None
        return self.mean + self.z_threshold * math.sqrt(self.var)

    def observe(self, global_norm: float) -> float:
        """Clip coefficient for this step's global norm; updates the statistics."""
        norm = float(global_norm)
        if not math.isfinite(norm):
            return 1.0  # the step is skipped, and its norm says nothing about the baseline
        threshold = self.threshold
        if threshold is None:
            self._buffer.append(norm)
            if len(self._buffer) >= self.warmup_steps:
                self._start_ema()
            if self.fallback_max_norm is None:
                return 1.0
            return clip_factor(norm, self.fallback_max_norm)
        if norm > threshold:
            self._update(threshold)  # the clipped value, so one spike cannot poison the baseline
            return threshold / (norm + EPS)
        self._update(norm)
        return 1.0

    def _start_ema(self) -> None:
        count = len(self._buffer)
        mean = sum(self._buffer) / count
        self.var = sum((x - mean) ** 2 for x in self._buffer) / count
        self.mean = mean
        self._buffer = []

    def _update(self, value: float) -> None:
        assert self.mean is not None and self.var is not None
        # zclip's order: the variance uses the freshly updated mean
        self.mean = self.alpha * self.mean + (1 - self.alpha) * value
        self.var = self.alpha * self.var + (1 - self.alpha) * (value - self.mean) ** 2

    def coefficients(self, norms: np.ndarray, global_norm: float,
                     names: Sequence[str]) -> np.ndarray:
        norms = check_norms(norms, names)
        return np.full(norms.shape[0], self.observe(global_norm))

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": list(self._buffer), "mean": self.mean, "var": self.var}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or not {"buffer", "mean", "var"} <= state.keys():
            raise UsageError(f"AdaptiveClip.load_state_dict: expected keys buffer, mean, var, "
                             f"got {state!r:.200}")
        mean, var = state["mean"], state["var"]
        if (mean is None) != (var is None):
            raise UsageError("AdaptiveClip.load_state_dict: mean and var must both be set or "
                             "both be None")
        try:
            buffer = [float(x) for x in state["buffer"]]
            stats = [] if mean is None else [float(mean), float(var)]
        except (TypeError, ValueError) as exc:
            raise UsageError(f"AdaptiveClip.load_state_dict: buffer, mean and var must be "
                             f"numbers ({exc})") from None
        if not all(math.isfinite(v) for v in buffer + stats) or (stats and stats[1] < 0):
            raise UsageError("AdaptiveClip.load_state_dict: the state holds a non-finite value "
                             "or a negative variance")
        self._buffer = buffer
        self.mean = None if mean is None else float(mean)
        self.var = None if var is None else float(var)

    def spec(self) -> dict[str, Any]:
        """The constructor's arguments; the statistics are state, kept by `state_dict`."""
        return {"type": "adaptive", "z_threshold": self.z_threshold, "alpha": self.alpha,
                "warmup_steps": self.warmup_steps, "fallback_max_norm": self.fallback_max_norm}

    def describe(self) -> str:
        head = f"adaptive (z > {self.z_threshold:g}, alpha {self.alpha:g})"
        if self.mean is None or self.var is None:
            fallback = ("no limit" if self.fallback_max_norm is None
                        else f"global norm <= {self.fallback_max_norm:g}")
            return (f"{head}: warming up ({len(self._buffer)}/{self.warmup_steps} steps, "
                    f"{fallback})")
        return (f"{head}: mean {self.mean:.4g}, std {math.sqrt(self.var):.4g}, "
                f"clips above {self.threshold:.4g}")
