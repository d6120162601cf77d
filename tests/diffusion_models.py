"""The tests' diffusion model: a tiny diffusers `UNet2DModel` built from a config."""

from __future__ import annotations

import pytest
import torch


def tiny_unet(channels: int = 3, size: int = 8, *, seed: int = 0) -> torch.nn.Module:
    """Two resolutions of 8 and 16 channels, no attention: a forward of a few milliseconds on a
    CPU. Skips the test where diffusers is not installed."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(seed)
    return diffusers.UNet2DModel(
        sample_size=size, in_channels=channels, out_channels=channels, layers_per_block=1,
        block_out_channels=(8, 16), down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"), norm_num_groups=4)
