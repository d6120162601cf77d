"""A reinforcement-learning log, told by its columns: its loss is a policy-gradient surrogate.

A trainer that samples from its policy and scores the samples (TRL's GRPO and RLOO with their
reward functions, PPO with a reward model, the policy-gradient trainers of OpenAI baselines and
stable-baselines) steps on a surrogate objective: the advantage-weighted log-probability ratio,
plus a KL term where there is one. Its level is near 0 and may be negative by design, and it
rises as the KL term grows while the policy learns: it is no quantity to minimise, and the
detectors that judge a loss's level (spikes, divergence, a bad start) would read progress as
trouble. The live callback leaves such a loss out for the same reason
(`trainguard.integrations.trl.minimises_objective`). What such a run shows of its health is in
its other columns (rewards, their spread, the KL), which the detectors read as the trainer's
metrics (`detect/trainer_metrics.py`).

The same holds of such a trainer's value loss (its regression targets are the returns of the
latest samples), which some logs hold as their only loss. So a log whose columns name the
scores of sampled completions or rollouts has its loss set aside as a further training loss
(`SURROGATE`): still watched for NaN and inf by a detector of its own (`analyze.offline`), and
a value that stays non-finite to the end of the log breaks the run (`analyze.lossless`), but
its level is not judged. A preference trainer's loss (DPO, KTO, ORPO: `rewards/chosen`,
`logps/...`) is a loss to minimise and is judged as one.
"""

from __future__ import annotations

import math
import re
import statistics

from trainguard.analyze.log import LOSS, Log
from trainguard.detect.kl_blowup import HISTORY
from trainguard.detect.settings import KLBlowupConfig
from trainguard.detect.trainer_metrics import KL

SAMPLED_SCORES = re.compile(
    r"^(reward|reward_std|frac_reward_zero_std|rewards/(?!chosen|rejected|margins|accuracies)"
    r"[^/]+/(mean|std)|objective/(scores|rlhf_reward)|ppo/.+|policy/(approxkl|clipfrac)_avg|"
    r"approx_?kl|pol_surr|ep_?rew_?mean|(.+/)?(episodic|episode|ep)_?(returns?|rewards?)(_mean)?|"
    r"clipfrac|train/clip_fraction)$")
"""Columns only a trainer that scores its own samples writes: the reward of the completions and
its spread (GRPO, RLOO; `rewards/<function>/mean`), a reward model's scores (PPO), the policy
update's approximate KL or clip fraction (PPO, baselines' `approxkl`, Stable-Baselines3's
`train/approx_kl`), the mean episode reward (`eprewmean`, `ep_rew_mean`), an episode's return
(CleanRL's `episodic_return`, `charts/episodic_return`), the share of samples whose probability
ratio was clipped, under the names PPO trainers give it (Spinning Up's `ClipFrac`,
Stable-Baselines3's `train/clip_fraction`; a gradient clipper's or DP-SGD's `clip_frac` is
not one)."""

SURROGATE = "surrogate loss"
"""The name a policy-gradient log's loss is set aside under (a further training loss)."""
REWARD = ("reward", "objective/scores", "objective/rlhf_reward", "ep_rew_mean", "eprewmean")
"""The reward columns a healthy run's summary names, in order of preference."""
REWARD_NAME = re.compile(r"(^|[\s_/])(rewards?|score|returns?)($|[\s_/])", re.IGNORECASE)
"""A value an RL loop prints of its episodes (`Average Score`, `reward avg`, `ep_reward`): what
a log without a loss says of the run."""
SCORED = frozenset({"f1", "bleu", "rouge", "dice", "iou", "map", "auc", "r2", "fid",
                    "inception", "clip", "bert", "meteor", "chrf", "accuracy", "acc"})
"""Words that name what a score measures, which no RL loop's episode score does
(`f1_score`, `inception_score`, `clip_score`): a model's quality, not a reward."""


def is_reward_name(name: str) -> bool:
    """A value an RL loop prints of its episodes (`REWARD_NAME`), not a named quality score."""
    if REWARD_NAME.search(name) is None:
        return False
    return SCORED.isdisjoint(re.split(r"[^a-z0-9]+", name.lower()))


def named_column(log: Log, names: tuple[str, ...]) -> str | None:
    """The log's series named one of `names` (in their order, whatever the case), or None."""
    by_lower = {n.lower(): n for n in log.series}
    return next((by_lower[n] for n in names if n in by_lower), None)


def reward_column(log: Log) -> str | None:
    """The log's reward column: one of `REWARD`, else the first named as a reward."""
    found = named_column(log, REWARD)
    return found if found is not None else next(
        (n for n in log.series if is_reward_name(n)), None)


def scored_samples(log: Log) -> str | None:
    """The first column of the log that shows its trainer scores its own samples, or None."""
    return next((name for name in log.series if SAMPLED_SCORES.match(name.lower())), None)


def set_aside_surrogate(log: Log) -> Log:
    """The log with its loss set aside as `SURROGATE` when it is a policy-gradient surrogate
    (a copy, with a note); the log itself otherwise."""
    shown_by = scored_samples(log)
    if shown_by is None:
        return log
    return log.loss_set_aside(SURROGATE, (
        f"the training loss is an RL trainer's ({shown_by} says it scores its own samples): "
            "a policy-gradient surrogate near 0 or negative by design, or a value loss whose "
            "targets move with the samples; it is watched for NaN and inf, not judged as a loss "
            "to minimise, and the run is judged on its rewards and KL"))


def set_aside(log: Log) -> bool:
    """Whether `set_aside_surrogate` set this (prepared) log's loss aside."""
    return SURROGATE in log.series and not log.has(LOSS)


def progress(log: Log) -> str | None:
    """What a policy-gradient run's reward and KL did from the first row to the last, for a
    healthy verdict's summary; None where the log holds neither."""
    parts = []
    for names in (REWARD, KL):
        name = reward_column(log) if names is REWARD else named_column(log, names)
        said = log.went(name) if name is not None else None
        if said is not None:
            parts.append(said)
    return "; ".join(parts) if parts else None


KL_BACK = 2.0
"""A KL whose median over its last `TYPICAL_ROWS` rows is within this many times its level
before a blow-up is back at that level (a policy that left its reference for good stays far
above it; a KL logged every step swings 2-4x from row to row, so one row says little)."""
TYPICAL_ROWS = 10
"""Rows of a KL or a reward whose median is its level at the end (a reward's before a blow-up
too)."""


def kl_came_back(log: Log, onset_row: int) -> str | None:
    """How a run whose only trouble was its KL to the reference blowing up came back, in words,
    or None when it did not: the KL finite on its rows after the onset (at least
    `TYPICAL_ROWS`), its median over the last `TYPICAL_ROWS` within `KL_BACK` times its level
    before the onset (`kl_blowup`'s: its median over the last `HISTORY` values, at least the
    detector's floor), and the reward, where the log holds one,
    no lower at the end (the median of its last `TYPICAL_ROWS` rows) than before the onset. The
    KL says how far the policy went, the reward what it learned: a KL that jumped and came back
    while the reward held is a note, not a verdict."""
    name = named_column(log, KL)
    if name is None:
        return None
    before, after = _around(log, name, onset_row)
    if not before or len(after) < TYPICAL_ROWS or not all(math.isfinite(v) for v in after):
        return None
    # its level as `kl_blowup` judged it: the median of its recent values, at least its floor
    level = max(statistics.median(before[-HISTORY:]), KLBlowupConfig().floor)
    end = statistics.median(after[-TYPICAL_ROWS:])
    if end > KL_BACK * level:
        return None
    said = (f"{name} came back to its level (a median of {end:.4g} over its last "
            f"{TYPICAL_ROWS} rows, against {level:.4g} before {log.label(onset_row)})")
    reward = reward_column(log)
    if reward is None:
        return said
    was, last = _around(log, reward, onset_row)
    was, last = was[-TYPICAL_ROWS:], last[-TYPICAL_ROWS:]
    if not last or not all(math.isfinite(v) for v in last) or (
            was and statistics.median(last) < statistics.median(was)):
        return None
    return (f"{said}, and {reward} ended at a median of {statistics.median(last):.4g}"
            + (f", no lower than the {statistics.median(was):.4g} before it" if was else ""))


def _around(log: Log, name: str, onset_row: int) -> tuple[list[float], list[float]]:
    """Series `name`'s finite values before `onset_row`, and its values after it."""
    rows, values = log.series.points(name)
    before = [v for r, v in zip(rows, values, strict=True) if r < onset_row and math.isfinite(v)]
    return before, [v for r, v in zip(rows, values, strict=True) if r > onset_row]


def before_first_update(log: Log) -> str | None:
    """How the set-aside loss shows an RL loop that acted before it learned, in words, or None:
    NaN (not inf) from the first row that holds it, then finite on every row to the end. An
    RL loop collects episodes before its first update (a replay buffer's warm-up,
    `learning_starts`) and logs the mean of no updates' values as NaN; a NaN that an update
    made would have stayed (NaN weights make NaN losses), and an overflow is inf."""
    if SURROGATE not in log.series:
        return None
    rows, values = log.series.points(SURROGATE)
    leading = next((k for k, value in enumerate(values) if not math.isnan(value)), len(values))
    if leading == 0 or leading == len(values) or not all(
            math.isfinite(v) for v in values[leading:]):
        return None
    return (f"the loss is NaN from {log.label(rows[0])} to {log.label(rows[leading - 1])} and "
            f"finite on every row from {log.label(rows[leading])} to the end: the loop acted "
            "before its first update (a replay buffer's warm-up) and logged the mean of no "
            "updates' values, not a blow-up")


def came_back(log: Log, onset_row: int) -> str | None:
    """How a run whose only trouble was its set-aside loss turning non-finite came back, in
    words, or None when it did not: the loss finite on every row after its last non-finite one
    (at least one), and the reward, where the log holds one, finite at the end and no lower than
    its last value before `onset_row` (a reward is what such a run climbs). With no loss level
    to come back to, this is what the log shows of a recovery."""
    if SURROGATE not in log.series:
        return None
    rows, values = log.series.points(SURROGATE)
    bad = [row for row, value in zip(rows, values, strict=True) if not math.isfinite(value)]
    after = [row for row in rows if bad and row > bad[-1]]
    if not bad or not after:
        return None
    said = f"the loss finite again from {log.label(after[0])} to the end"
    name = named_column(log, REWARD)
    if name is None:
        return said
    before, _ = _around(log, name, onset_row)
    _, rewards = log.series.points(name)
    last = rewards[-1] if rewards else math.nan
    if not math.isfinite(last) or (before and last < before[-1]):
        return None
    return (f"{said}, and {name} ended at {last:.4g}"
            + (f", no lower than the {before[-1]:.4g} before the trouble" if before else ""))
