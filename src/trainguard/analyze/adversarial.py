"""A generative adversarial network's log, told by its columns: its losses are a game's.

A GAN's generator and discriminator each minimise a loss against the other: as one gets better,
the other's loss rises. Neither level says whether the run is healthy (a generator loss that
climbs while the discriminator's falls is the usual course of many runs that end with good
samples), and the detectors that judge a loss's level (spikes, divergence, a bad start) would
read the game as trouble. So a log that holds a discriminator's loss (`loss_dis`, `d_loss`,
`loss_D`, `Dis Loss`: no other kind of training has one) has its loss set aside as `GAME`, a
further training loss: still watched for NaN and inf, each loss of the log is, and a value that
stays non-finite to the end breaks the run (`analyze.lossless`), but no level is judged.

One way a game ends is read (`discriminator_won`): a discriminator whose loss sits at its floor
from some row to the end tells every generated sample from a real one, and the run learns
nothing more from the game: `stalled`, as the live verdict says of a run that learns nothing.
"""

from __future__ import annotations

import math
import re
import statistics

from trainguard.analyze.log import LOSS, Log, is_train_loss

GAME = "game loss"
"""The name a GAN log's loss is set aside under (a further training loss)."""
DISCRIMINATOR = re.compile(r"(?:^|[\s_/.-])(?:d|dis|disc|discriminator|netd)(?:$|[\s_/.-])",
                           re.IGNORECASE)
"""A name's part that names the discriminator (`loss_dis`, `d_loss`, `loss_D`, `Dis Loss`)."""


def discriminator_loss(log: Log) -> str | None:
    """The log's first training loss named for a discriminator, or None (the loss itself when it
    was read from one: `[D loss: 0.6] [G loss: 0.9]`, its first series the discriminator's)."""
    if log.loss_from is not None and DISCRIMINATOR.search(log.loss_from):
        return log.loss_from
    return next((name for name in log.series
                 if name != LOSS and is_train_loss(name) and DISCRIMINATOR.search(name)), None)


def set_aside_game(log: Log) -> Log:
    """The log with its loss set aside as `GAME` when the log is a GAN's (a copy, with a note);
    the log itself otherwise."""
    shown_by = discriminator_loss(log)
    if shown_by is None:
        return log
    return log.loss_set_aside(GAME, (
        f"the log holds a discriminator's loss ({shown_by}): a GAN's losses are a game's, where "
        "one player's rising loss is the other's progress; they are watched for NaN and inf, "
        "not judged as losses to minimise"))


def progress(log: Log) -> str | None:
    """What a GAN log's losses did from the first row to the last, for a healthy verdict's
    summary; None where the log's loss was not set aside as a game's."""
    if GAME not in log.series:
        return None
    parts = [said for name in dict.fromkeys((GAME, discriminator_loss(log)))
             if name is not None and name in log.series and (said := log.went(name)) is not None]
    return "; ".join(parts) + " (levels not judged)" if parts else None


WON_LEVEL = 0.05
"""A discriminator's loss at or under this share of its early level (the median of its first
`EARLY_ROWS` rows) is at its floor: it tells every real sample from every generated one..."""
WON_SHARE = 0.5
"""...and on at least this share of the rows from the first such row to the end, the
discriminator has won the game for good..."""
WON_ROWS = 50
"""...over at least this many rows, and at least `WON_PART` of the log's rows: a run of a few
confident batches is part of the game."""
WON_PART = 0.1
EARLY_ROWS = 20


def discriminator_won(log: Log) -> tuple[int, str] | None:
    """The row from which a GAN's discriminator has won for good, and why in words; None
    otherwise. A discriminator loss at its floor (at most `WON_LEVEL` of its early level) on
    most rows from some row to the end (`WON_SHARE`, over at least `WON_ROWS` rows, and on the
    last ones too) means it tells every generated sample from a real one: its generator gets no
    gradient it can use from the adversarial term (the CycleGAN maintainers: a discriminator
    loss near 0 for a while means the training has collapsed), whatever the other terms do (a
    cycle or reconstruction loss keeps falling). The first row at the floor from which that
    holds is the onset."""
    for name in log.series:
        named = log.loss_from if name == LOSS else name  # `loss_D_A` read as the loss
        if named is None or not (name == LOSS or is_train_loss(name)):
            continue
        if not DISCRIMINATOR.search(named):
            continue
        found = _won(log, name)
        if found is not None:
            return found
    return None


def _won(log: Log, name: str) -> tuple[int, str] | None:
    rows, values = log.series.points(name)
    finite = [(row, value) for row, value in zip(rows, values, strict=True)
              if value is not None and math.isfinite(value)]
    if len(finite) < EARLY_ROWS + WON_ROWS or any(v < 0 for _, v in finite):
        return None  # (a Wasserstein critic's loss is negative: near 0 is a close game)
    early = statistics.median(v for _, v in finite[:EARLY_ROWS])
    if not early > 0:
        return None
    floor = WON_LEVEL * early
    won = [v <= floor for _, v in finite]
    shortest = max(WON_ROWS, int(WON_PART * len(finite)))
    if sum(won[-shortest:]) < WON_SHARE * shortest:
        return None  # the game goes on at the end: a discriminator caught up is no collapse
    count, onset = 0, None
    for at in range(len(won) - 1, EARLY_ROWS - 1, -1):  # the suffixes, shortest first
        count += won[at]
        if won[at] and len(won) - at >= shortest and count >= WON_SHARE * (len(won) - at):
            onset = at
    if onset is None:
        return None
    tail = len(won) - onset
    share = sum(won[onset:]) / tail
    named = log.loss_from if name == LOSS else name
    return finite[onset][0], (
        f"the discriminator's loss {named} is at its floor (at most {floor:.3g}, "
        f"{WON_LEVEL:.0%} of its early level {early:.3g}) on {share:.0%} of the {tail} rows "
        f"from here to the end: the discriminator tells every generated sample from a real "
        f"one, and its generator gets nothing from the adversarial term (the game collapsed)")
