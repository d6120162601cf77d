"""`metric_collapse`: evaluation metrics that say training went wrong, when the loss may not.

Fed by `guard.observe_eval(metrics)` (and by the Hugging Face and Lightning callbacks from their
evaluation metrics), not by the step signals. Three rules, each reported once per episode:

- **accuracy at chance**: a metric whose name holds "acc" falls to within `CHANCE_MARGIN` of
  1 / classes (`GuardConfig.probes.num_classes`, or the width of the model's class scores) after it
  was clearly above chance: the model stopped telling the classes apart. A model that has not yet
  learned (at chance from the start) is no alarm.
- **eval loss rising while the train loss falls**: the median of an eval loss's last
  `detectors.metric_collapse.patience` evaluations is 10% above its best such median and beyond four
  times the evaluations' own noise (the spread of their changes), while the train loss fell since
  that best: overfitting, or training on data that no longer matches the evaluation (wrong labels).
- **a metric falling off a cliff**: a higher-is-better metric below half its best, or a
  lower-is-better one (a loss, a perplexity, an error rate) above three times its best.

Only quality metrics (`is_quality_metric`: a loss, an accuracy, an F1, a BLEU score, a
perplexity... by name) are judged; throughput, runtime and memory figures never collapse. NaN and
inf metrics are reported as such and never enter a best value.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

from trainguard.detect.settings import DetectorConfig
from trainguard.events import Event
from trainguard.signals import MAD_TO_STD

CHANCE_MARGIN = 1.2
"""At most this many times chance is "at chance"."""
LEARNED_MARGIN = 1.5
"""At least this many times chance was "clearly above chance"."""
CLIFF_DROP = 0.5
CLIFF_RISE = 3.0
RISE_MARGIN = 1.1
HISTORY = 20
"""Evaluations of a metric kept to judge its trend."""
LOWER_IS_BETTER = ("loss", "perplex", "ppl", "error", "nll")
"""Parts of the names of metrics that fall as the model improves (`perplex`: the stem, as the
quality rule reads it, so a log's own spelling, `perplextity`, counts too)..."""
LOWER_IS_BETTER_WORDS = frozenset({"wer", "cer", "mse", "mae", "rmse", "err", "fid"})
"""...and whole words of them, too short to find inside a word (`answer_f1` is no word error
rate, `eval_confidence` no FID: the Frechet inception distance of generated images; `top1_err`
an error rate)."""


QUALITY = ("loss", "acc", "f1", "bleu", "rouge", "meteor", "chrf", "perplexity", "ppl",
           "error", "wer", "cer", "mse", "mae", "rmse", "auc", "auroc", "precision", "recall",
           "iou", "miou", "dice", "map", "exact", "em", "matthews", "mcc", "spearman", "pearson",
           "r2", "score", "reward", "top1", "top5", "psnr", "ssim", "fid", "kl", "nll")
"""Words that name what a model is judged on; only such metrics can collapse."""
NOT_QUALITY = ("runtime", "per_second", "samples_per", "steps_per", "tokens_per", "_time",
               "time_", "memory", "mem_", "flos", "epoch", "throughput", "latency", "seconds",
               "_lr", "learning_rate", "num_", "batch_size")
"""Throughput, clocks, memory and bookkeeping: they move for reasons that are not the model's."""


def lower_is_better(name: str) -> bool:
    lowered = name.lower()
    return (any(part in lowered for part in LOWER_IS_BETTER)
            or not LOWER_IS_BETTER_WORDS.isdisjoint(re.split(r"[^a-z0-9]+", lowered)))


def within_cliff(name: str, value: float, best: float) -> bool:
    """Whether `value` is within the cliff's bound of `best`: a lower-is-better metric at most
    `CLIFF_RISE` times it, another at least `CLIFF_DROP` of it."""
    if lower_is_better(name):
        return value <= CLIFF_RISE * best
    return value >= CLIFF_DROP * best


def is_quality_metric(name: str) -> bool:
    """A metric of the model's quality (a loss, an accuracy, an F1, a BLEU score...), by name:
    never a throughput, a runtime or a memory figure (`eval_samples_per_second` falling is a
    slower machine, not a worse model)."""
    lowered = name.lower()
    if any(word in lowered for word in NOT_QUALITY):
        return False
    words = [w for w in re.split(r"[^a-z0-9]+", lowered) if w]
    return any(w in QUALITY or w.startswith(QUALITY_PREFIXES) for w in words)


QUALITY_PREFIXES = ("acc", "loss", "f1", "bleu", "rouge", "perplex", "precision", "recall")


class MetricCollapse:
    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self.best: dict[str, float] = {}
        self.learned: set[str] = set()
        self.active: set[str] = set()
        """(metric, rule) pairs whose episode is on, as 'name|rule'."""
        self.history: dict[str, list[float]] = {}
        self.previous: dict[str, float] = {}
        self.train_at_best: dict[str, float] = {}

    def observe(self, metrics: Mapping[str, Any], step: int, *, classes: int | None,
                train_loss: float | None) -> list[Event]:
        events: list[Event] = []
        for name, raw in metrics.items():
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                continue
            if not is_quality_metric(name):
                continue
            value = float(raw)
            if not math.isfinite(value):
                events += self._once(name, "nonfinite", True, step, "error",
                                     f"eval metric {name} is {value}", value)
                continue
            self._once(name, "nonfinite", False, step, "info", "", value)
            found: list[Event] = []
            if "acc" in name.lower() and classes:
                found += self._chance(name, value, step, classes)
            if lower_is_better(name):
                found += self._rising(name, value, step, train_loss)
            cliff = self._cliff(name, value, step)
            events += found or cliff  # one event per metric and evaluation
            self._remember(name, value, train_loss)
        return events

    def _chance(self, name: str, value: float, step: int, classes: int) -> list[Event]:
        chance = 1.0 / classes
        if value >= LEARNED_MARGIN * chance:
            self.learned.add(name)
        at_chance = name in self.learned and value <= CHANCE_MARGIN * chance
        return self._once(name, "chance", at_chance, step, "warning",
                          f"eval {name} {value:.3g} is at chance level ({chance:.3g} for "
                          f"{classes} classes) after it was above it: the model no longer tells "
                          "the classes apart", value, chance=chance, classes=classes)

    def _rising(self, name: str, value: float, step: int,
                train_loss: float | None) -> list[Event]:
        window = self.config.metric_collapse.patience
        history = self.history.setdefault(name, [])
        history.append(value)
        del history[:-HISTORY]
        if len(history) < window + 1:
            return []
        level = statistics.median(history[-window:])
        levels = [statistics.median(history[i:i + window])
                  for i in range(len(history) - window + 1)]
        best_at = min(range(len(levels)), key=levels.__getitem__)
        best = levels[best_at]
        diffs = [b - a for a, b in pairwise(history)]
        noise = (MAD_TO_STD * statistics.median(abs(d - statistics.median(diffs)) for d in diffs)
                 / math.sqrt(2))
        train_best = self.train_at_best.get(name)
        worse = (best_at < len(levels) - 1 and level > RISE_MARGIN * best
                 and level > best + 4 * noise and train_loss is not None
                 and train_best is not None and train_loss < train_best)
        return self._once(name, "rising", worse, step, "warning",
                          f"eval {name} has risen to {level:.4g} (the median of its last {window} "
                          f"evaluations; its best was {best:.4g}) while the train loss fell: "
                          "overfitting, or training data that no longer matches the evaluation",
                          value, best=best)

    def _cliff(self, name: str, value: float, step: int) -> list[Event]:
        best = self.best.get(name)
        if best is None:
            return []
        cliff = best > 0 and not within_cliff(name, value, best)
        if not cliff:
            what = ""
        elif lower_is_better(name):
            what = f"rose to {value:.4g}, {value / best:.3g}x its best {best:.4g}"
        else:
            what = f"fell to {value:.4g} from its best {best:.4g}"
        return self._once(name, "cliff", cliff, step, "warning",
                          f"eval {name} {what}: it fell off a cliff", value, best=best)

    def _remember(self, name: str, value: float, train_loss: float | None) -> None:
        best = self.best.get(name)
        better = best is None or (value < best if lower_is_better(name) else value > best)
        if better:
            self.best[name] = value
            if train_loss is not None:
                self.train_at_best[name] = train_loss
        self.previous[name] = value

    def _once(self, name: str, rule: str, now: bool, step: int, severity: Any, message: str,
              value: float, **details: Any) -> list[Event]:
        key = f"{name}|{rule}"
        if not now:
            self.active.discard(key)
            return []
        if key in self.active:
            return []
        self.active.add(key)
        return [Event(kind="metric_collapse", step=step, severity=severity, message=message,
                      param=name, value=value,
                      details={"metric": name, "rule": rule, **details})]

    def state_dict(self) -> dict[str, Any]:
        return {"best": dict(self.best), "learned": sorted(self.learned),
                "active": sorted(self.active),
                "history": {k: list(v) for k, v in self.history.items()},
                "previous": dict(self.previous), "train_at_best": dict(self.train_at_best)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = {k: float(v) for k, v in state["best"].items()}
        self.learned = set(state["learned"])
        self.active = set(state["active"])
        self.history = {k: [float(x) for x in v] for k, v in state["history"].items()}
        self.previous = {k: float(v) for k, v in state["previous"].items()}
        self.train_at_best = {k: float(v) for k, v in state["train_at_best"].items()}
