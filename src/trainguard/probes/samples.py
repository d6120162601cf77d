"""Samples seen: what a generative model makes, looked at every so often.

A diffusion model's loss is a noise-prediction MSE that barely moves when its samples turn into
colour noise, so the loss says late, or never, what the samples show at once. With a
`sample_fn(model) -> images` (a few denoising steps of a fixed seed: the user's pipeline call,
or `trainguard.recipes.sampler`), the Guard makes a small batch of images every so often and
reduces each batch to a handful of numbers (`image_stats`) that `detect/sample_judge.py` judges
against the run's own first samples.

Cost: generating is the expensive part (a few forward passes of the model), so it runs on its
own cadence, never inside the step's measurement: every `probes.samples_every` steps at most, and
further apart when a call costs more than `probes.samples_budget` of the training time between
two calls (its own time measured on each call). It runs under `torch.no_grad()`, with the model
in eval mode and the global RNG states put back afterwards: the training that follows is the
same, bit for bit, as without it (`observe` stays neutral).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn

from trainguard.probes.sample_sheet import SampleSheet, display_range, draw
from trainguard.rng import process_state, put_process_state

log = logging.getLogger("trainguard")

SampleFn = Callable[[nn.Module], torch.Tensor]


@dataclass(frozen=True, slots=True)
class ImageStats:
    """A batch of images reduced to what tells smooth pictures from noise, flat fields, clipped
    colours and copies of one image. Every value is a float on the host."""

    nonfinite: float
    """The share of values that are NaN or inf."""
    roughness: float
    """The mean squared difference of neighbouring pixels over twice the pixels' variance, per
    image and channel, averaged: about 0 for smooth pictures, 1 for white noise (neighbours
    unrelated), up to 2 for a checkerboard."""
    spread: float
    """The standard deviation of each image's pixels, averaged over the images."""
    saturated: float
    """The share of pixels at the batch's own extremes (within 1% of its range): a sampler that
    clamps its output piles blown-out images there."""
    diversity: float
    """The standard deviation across the batch of each pixel, averaged: 0 when every sample is
    the same image."""


def image_stats(images: torch.Tensor) -> ImageStats:
    """`images`: N x C x H x W (or N x H x W) floats in any range; one host read."""
    x = images.detach().float()
    if x.dim() == 3:
        x = x.unsqueeze(1)
    if x.dim() != 4 or x.shape[-1] < 2 or x.shape[-2] < 2:
        raise ValueError(f"samples must be N x C x H x W images, got shape {tuple(images.shape)}")
    finite = torch.isfinite(x)
    nonfinite = 1.0 - finite.float().mean()
    x = torch.where(finite, x, torch.zeros_like(x))
    var = x.var(dim=(-2, -1), unbiased=False)  # N x C
    dx = (x[..., :, 1:] - x[..., :, :-1]).square().mean(dim=(-2, -1))
    dy = (x[..., 1:, :] - x[..., :-1, :]).square().mean(dim=(-2, -1))
    smooth = var > 1e-12
    roughness = torch.where(smooth, (dx + dy) / (4 * var.clamp_min(1e-12)), torch.zeros_like(var))
    low, high = x.amin(), x.amax()
    edge = (high - low) * 0.01
    saturated = ((x <= low + edge) | (x >= high - edge)).float().mean()
    spread = x.flatten(1).std(dim=1, unbiased=False).mean()
    diversity = (x.std(dim=0, unbiased=False).mean() if x.shape[0] > 1
                 else torch.zeros((), device=x.device))
    packed = torch.stack([nonfinite, roughness.mean(), spread, saturated, diversity])
    values = [float(v) for v in packed.cpu().tolist()]  # the probe's one read, off the step
    return ImageStats(*values)


class SampleProbe:
    """Calls `sample_fn` on its cadence, neutrally; `due` and `take` are the Guard's."""

    def __init__(self, sample_fn: SampleFn, every: int, budget: float) -> None:
        self.sample_fn = sample_fn
        self.every = max(1, every)
        self.budget = budget
        self.next_step = 0
        """The first step whose end may make samples."""
        self.seconds = 0.0
        """The last call's time."""
        self.calls = 0
        self.spent = 0.0
        """Seconds spent making samples, all calls together."""
        self._since: float | None = None
        """When the last call ended (the training time since is what the budget shares)."""
        self._gap_steps = self.every
        """The steps between the last two calls."""
        self.last: torch.Tensor | None = None
        """The last samples, small, on the host (for a report)."""
        self.range: tuple[float, float] | None = None
        """The colour range every drawing of the run uses: the first samples' range."""

    def due(self, step: int) -> bool:
        return step >= self.next_step

    def take(self, model: nn.Module, step: int) -> ImageStats | None:
        """Make and measure the samples after `step`'s update; None when `sample_fn` failed (it
        is logged: a sampler's bug never stops the training)."""
        now = time.perf_counter()
        trained = None if self._since is None else now - self._since
        state = process_state()  # a sampler that draws from the global generators
        was_training = model.training
        try:
            model.eval()
            with torch.no_grad():
                images = self.sample_fn(model)
            stats = image_stats(images)
            self.last = images.detach()[:8].float().cpu()
        except Exception as exc:  # never the cause of a failed run
            log.error("trainguard: sample_fn failed at step %d (%s: %s); samples are not "
                      "checked this time", step, type(exc).__name__, exc)
            stats = None
        finally:
            model.train(was_training)
            put_process_state(state)
        end = time.perf_counter()
        self.seconds = end - now
        self.calls += 1
        self.spent += self.seconds
        self._since = end
        gap = self._gap(trained)
        self.next_step, self._gap_steps = step + gap, gap
        return stats

    def sheet(self, step: int, stats: ImageStats, *, degraded: bool) -> SampleSheet | None:
        """The last samples drawn in the run's colour range (fixed by the first samples)."""
        if self.last is None:
            return None
        first = self.range is None
        if self.range is None:
            self.range = display_range(self.last)
        return SampleSheet(step=step, pixels=draw(self.last, *self.range), stats=asdict(stats),
                           degraded=degraded, first=first)

    def _gap(self, trained: float | None) -> int:
        """Steps until the next call: `every`, or more when a call costs more than `budget` of
        the training time it would share (the last call's cost over the steps' pace)."""
        if trained is None or trained <= 0 or self.budget <= 0:
            return self.every
        per_step = trained / self._gap_steps
        needed = self.seconds / (self.budget * per_step)
        return max(self.every, math.ceil(needed))
