"""A few samples as one small picture, for the report and the run store.

The samples `probes/samples.py` makes are drawn side by side in one strip (at most `PER_SHEET`
images, each at most `SIDE` pixels a side), every strip of a run in the same colour range: the
range of the run's first samples, so an image that blows out or fades shows as such. NaN and inf
pixels are drawn magenta, never as a colour a finite value could have. Encoded as PNG here, with
`zlib` alone, so the run store and the HTML report need no imaging library.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

PER_SHEET = 4
"""Images drawn per strip."""
SIDE = 64
"""Largest width or height of one drawn image, in pixels."""
GAP = 2
"""Pixels between two images of a strip."""
NONFINITE_RGB = (255, 0, 255)


@dataclass(slots=True)
class SampleSheet:
    """The samples made after one step, drawn; what a sink is handed."""

    step: int
    pixels: np.ndarray
    """H x W x 3, uint8: the strip."""
    stats: dict[str, float]
    """The batch's `ImageStats`, by name."""
    degraded: bool
    """The sample judge held the samples broken after this step."""
    first: bool = False
    """The run's first samples: the reference the others are judged against."""

    def png(self) -> bytes:
        return png_bytes(self.pixels)


def display_range(images: torch.Tensor) -> tuple[float, float]:
    """The finite range of `images` (the run's first samples), or (0, 1) when it has none."""
    x = images.detach().float()
    finite = x[torch.isfinite(x)]
    if finite.numel() == 0:
        return 0.0, 1.0
    low, high = float(finite.min()), float(finite.max())
    return (low, high) if high > low else (low - 0.5, low + 0.5)


def draw(images: torch.Tensor, low: float, high: float) -> np.ndarray:
    """`images` (N x C x H x W, or N x H x W) as one H x W x 3 uint8 strip: the first
    `PER_SHEET`, each shrunk to at most `SIDE` pixels a side, `low`..`high` mapped to 0..255."""
    x = images.detach().float().cpu()[:PER_SHEET]
    if x.dim() == 3:
        x = x.unsqueeze(1)
    channels = x.shape[1]
    x = x[:, :3] if channels >= 3 else x[:, :1].expand(-1, 3, -1, -1)
    height, width = x.shape[-2:]
    scale = max(1, -(-max(height, width) // SIDE))
    if scale > 1:  # average pooling: a NaN in a block stays a NaN
        x = F.avg_pool2d(x, scale, ceil_mode=True)
    bad = ~torch.isfinite(x).all(dim=1, keepdim=True).expand_as(x)
    levels = ((x - low) / (high - low) * 255.0).clamp(0, 255).nan_to_num(0.0)
    rgb = levels.round().to(torch.uint8)
    magenta = torch.tensor(NONFINITE_RGB, dtype=torch.uint8).view(1, 3, 1, 1).expand_as(rgb)
    rgb = torch.where(bad, magenta, rgb)
    n, _, h, w = rgb.shape
    strip = torch.full((3, h, n * w + (n - 1) * GAP), 255, dtype=torch.uint8)
    for i in range(n):
        strip[:, :, i * (w + GAP):i * (w + GAP) + w] = rgb[i]
    return strip.permute(1, 2, 0).contiguous().numpy()


def png_bytes(pixels: np.ndarray) -> bytes:
    """An H x W x 3 uint8 array as a PNG file (8-bit RGB, no filter)."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected H x W x 3 uint8 pixels, got {pixels.dtype} {pixels.shape}")
    height, width = pixels.shape[:2]
    rows = np.concatenate([np.zeros((height, 1), dtype=np.uint8),
                           pixels.reshape(height, width * 3)], axis=1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6)) + chunk(b"IEND", b""))
