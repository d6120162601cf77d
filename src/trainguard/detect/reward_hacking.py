"""`reward_hacking`: with several reward functions, one climbs while another falls or never
pays.

A trainer that sums several rewards (GRPO, RLOO: a format reward and an accuracy reward) logs
each one's mean and spread (`rewards/<func>/mean`, `/std`). A policy that learns the task
raises them together; one that climbs a single reward while another falls below where it
started, or stays at exactly 0, learned to collect the easy reward and not the task. A reward
"climbed" or "fell" when the median of its last `detectors.reward_hacking.window` means moved
from its starting level (the median of its first `warmup` means) by more than its own spread
over the completions at the start, and by at least `least`. Reported once per episode.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

from trainguard.detect.base import Detector, Episode
from trainguard.detect.trainer_metrics import REWARD_FUNC_MEAN
from trainguard.events import Event
from trainguard.signals import StepSignals


class RewardTrack:
    """One reward function's start (its first means and spreads) and its recent means."""

    def __init__(self, warmup: int, window: int) -> None:
        self.warmup = warmup
        self.first: list[float] = []
        self.first_std: list[float] = []
        self.recent: deque[float] = deque(maxlen=window)
        self.ever_paid = False

    def add(self, mean: float, std: float | None) -> None:
        self.ever_paid |= mean != 0.0
        if len(self.first) < self.warmup:
            self.first.append(mean)
            if std is not None and math.isfinite(std):
                self.first_std.append(std)
            return
        self.recent.append(mean)

    @property
    def ready(self) -> bool:
        return len(self.first) == self.warmup and len(self.recent) == self.recent.maxlen

    def moved(self, least: float) -> float:
        """How far the recent means moved from the start, in units of the start's spread (0
        when within it)."""
        start, now = statistics.median(self.first), statistics.median(self.recent)
        unit = max(statistics.median(self.first_std) if self.first_std else 0.0, least)
        return (now - start) / unit if abs(now - start) > unit else 0.0


class RewardHacking(Detector):
    kind = "reward_hacking"
    reads = frozenset({"trainer_metrics"})

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.tracks: dict[str, RewardTrack] = {}
        self.episode = Episode(config.common.rearm_steps)
        self.funcs: dict[str, str | None] = {}
        """Each metric name seen: the reward function whose mean it is, or None (a regex
        match once per name, not once per step)."""

    def check(self, signals: StepSignals) -> list[Event]:
        metrics = signals.trainer_metrics
        settings = self.config.reward_hacking
        for name, value in metrics.items():
            func = self.funcs.get(name, "")
            if func == "":
                found = REWARD_FUNC_MEAN.match(name)
                func = self.funcs[name] = None if found is None else found.group("name")
            if func is None or not math.isfinite(value):
                continue  # a NaN reward is `nonfinite_metric`'s
            track = self.tracks.setdefault(func, RewardTrack(settings.warmup, settings.window))
            track.add(value, metrics.get(f"rewards/{func}/std"))
        if not self.tracks:  # no reward function logged yet: nothing to judge, the episode calms
            self.episode.update(False)
            return []
        ready = {f: t for f, t in self.tracks.items() if t.ready}
        if len(ready) < 2:  # one reward cannot climb while another lags
            self.episode.update(False)
            return []
        moved = {f: t.moved(settings.least) for f, t in ready.items()}
        climbing = [f for f, m in moved.items() if m > 0]
        lagging = {f: ("fell" if moved[f] < 0 else "never paid")
                   for f, t in ready.items() if moved[f] < 0 or not t.ever_paid}
        hacked = bool(climbing) and bool(lagging)
        if not self.episode.update(hacked):
            return []
        up = max(climbing, key=lambda f: moved[f])
        track = ready[up]
        lag = ", ".join(
            f"{f} {how}" + (f" ({statistics.median(ready[f].first):.3g} to "
                            f"{statistics.median(ready[f].recent):.3g})" if how == "fell"
                            else " (0 on every step)")
            for f, how in lagging.items())
        return [self.event(
            signals.step, "warning",
            f"the reward {up} climbed from {statistics.median(track.first):.3g} to "
            f"{statistics.median(track.recent):.3g} while {lag}: the policy collects one "
            "reward and not the others, it learns to please that reward, not the task",
            param=f"rewards/{up}/mean", value=statistics.median(track.recent),
            climbing=up, lagging=sorted(lagging))]

    def state_dict(self) -> dict[str, Any]:
        return {"tracks": {f: {"first": t.first, "first_std": t.first_std,
                               "recent": list(t.recent), "ever_paid": t.ever_paid}
                           for f, t in self.tracks.items()},
                "episode": self.episode.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        settings = self.config.reward_hacking
        self.tracks = {}
        for func, saved in state.get("tracks", {}).items():
            track = RewardTrack(settings.warmup, settings.window)
            track.first = [float(v) for v in saved["first"]]
            track.first_std = [float(v) for v in saved["first_std"]]
            track.recent.extend(float(v) for v in saved["recent"])
            track.ever_paid = bool(saved["ever_paid"])
            self.tracks[func] = track
        if "episode" in state:
            self.episode.load_state_dict(state["episode"])
