"""The samples' judge on synthetic images: smooth pictures, and what a broken model makes."""

from __future__ import annotations

import math

import pytest
import torch

from trainguard.detect.sample_judge import REARM, SampleJudge, sample_faults
from trainguard.probes.samples import image_stats


def smooth(n: int = 4, size: int = 16, seed: int = 0) -> torch.Tensor:
    """Soft blobs of random colours on a gradient: what a working model's samples look like."""
    g = torch.Generator().manual_seed(seed)
    grid = torch.linspace(-1, 1, size)
    y, x = torch.meshgrid(grid, grid, indexing="ij")
    centre = torch.rand(n, 2, 1, 1, generator=g) - 0.5
    blob = torch.exp(-((x - centre[:, 0]) ** 2 + (y - centre[:, 1]) ** 2) * 4).unsqueeze(1)
    colour = torch.rand(n, 3, 1, 1, generator=g) * 2 - 1
    return (blob * colour + 0.3 * x).clamp(-1, 1)


def noisy(n: int = 4, size: int = 16) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(1)) * 2 - 1


def blotched(n: int = 4, size: int = 16) -> torch.Tensor:
    """Large flat patches pinned at the extremes: blown-out colour blotches."""
    base = smooth(n, size)
    return torch.where(base > 0, torch.ones_like(base), -torch.ones_like(base))


CASES = {
    "noisy": (noisy(), "colour noise"),
    "blotched": (blotched(), "blown-out colours"),
    "constant": (torch.full((4, 3, 16, 16), 0.2), "flat images"),
    "alike": (smooth(1).repeat(4, 1, 1, 1), "every sample alike"),
    "nan": (smooth().masked_fill(torch.rand(4, 3, 16, 16) < 0.05, math.nan), "non-finite"),
}


@pytest.mark.parametrize("name", CASES)
def test_each_failure_is_named_against_smooth_first_samples(name: str) -> None:
    images, said = CASES[name]
    faults = sample_faults(image_stats(smooth()), image_stats(images))
    assert any(said in f for f in faults), faults


def test_other_smooth_samples_are_no_failure() -> None:
    reference = image_stats(smooth(seed=0))
    for seed in range(1, 6):
        assert sample_faults(reference, image_stats(smooth(seed=seed))) == []


def test_the_measures_mean_what_they_say() -> None:
    white = image_stats(torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
    assert 0.9 < white.roughness < 1.1  # neighbours unrelated
    assert image_stats(smooth()).roughness < 0.1
    assert image_stats(torch.zeros(2, 3, 8, 8)).spread == 0.0
    with pytest.raises(ValueError, match="N x C x H x W"):
        image_stats(torch.zeros(4, 16))


def test_first_samples_already_rough_are_the_reference_not_a_failure() -> None:
    """A model trained from scratch starts from noise: its own first samples set the bar."""
    judge = SampleJudge()
    assert judge.judge(-1, image_stats(noisy())) == []
    assert judge.judge(10, image_stats(noisy())) == []


def test_a_failure_is_said_once_and_again_only_after_it_went_away() -> None:
    judge = SampleJudge()
    judge.judge(-1, image_stats(smooth()))
    [event] = judge.judge(5, image_stats(noisy()))
    assert event.kind == "samples_degraded" and event.severity == "warning"
    assert "before its first update" in event.message and "colour noise" in event.message
    assert judge.judge(10, image_stats(noisy())) == []
    judge.judge(15, image_stats(smooth(seed=2)))  # one clean check: still the same failure
    assert judge.judge(20, image_stats(noisy())) == []
    for step in range(25, 25 + 5 * REARM, 5):
        judge.judge(step, image_stats(smooth(seed=3)))
    assert [e.step for e in judge.judge(100, image_stats(noisy()))] == [100]


def test_the_failure_still_shown_by_the_last_check_is_kept_for_the_verdict() -> None:
    judge = SampleJudge()
    judge.judge(-1, image_stats(smooth()))
    assert judge.broken is None
    judge.judge(5, image_stats(noisy()))
    judge.judge(10, image_stats(noisy()))
    assert judge.broken is not None and judge.broken[0] == 5 and "colour noise" in judge.broken[1]
    for step in range(15, 15 + 5 * (REARM - 1), 5):  # clean, but not yet for long enough
        judge.judge(step, image_stats(smooth(seed=4)))
        assert judge.broken is not None
    judge.judge(100, image_stats(smooth(seed=4)))
    assert judge.broken is None
