"""A generative adversarial network's log, told by its columns: its losses are a game's.

A GAN's generator and discriminator each minimise a loss against the other: as one gets better,
the other's loss rises. Neither level says whether the run is healthy (a generator loss that
climbs while the discriminator's falls is the usual course of many runs that end with good
samples), and the detectors that judge a loss's level (spikes, divergence, a bad start) would
read the game as trouble. So a log that holds a discriminator's loss (`loss_dis`, `d_loss`,
`loss_D`, `Dis Loss`: no other kind of training has one) has its loss set aside as `GAME`, a
further training loss: still watched for NaN and inf, each loss of the log is, and a value that
stays non-finite to the end breaks the run (`analyze.lossless`), but no level is judged.
"""

from __future__ import annotations

import re

from trainguard.analyze.log import LOSS, Log, is_train_loss

GAME = "game loss"
"""The name a GAN log's loss is set aside under (a further training loss)."""
DISCRIMINATOR = re.compile(r"(?:^|[\s_/.-])(?:d|dis|disc|discriminator|netd)(?:$|[\s_/.-])",
                           re.IGNORECASE)
"""A name's part that names the discriminator (`loss_dis`, `d_loss`, `loss_D`, `Dis Loss`)."""


def discriminator_loss(log: Log) -> str | None:
    """The log's first training loss named for a discriminator, or None."""
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
    parts = [said for name in (GAME, discriminator_loss(log))
             if name is not None and (said := log.went(name)) is not None]
    return "; ".join(parts) + " (levels not judged)" if parts else None
