"""Samples drawn in one strip: the run's colour range, NaN magenta, a PNG any reader decodes."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
import torch

from trainguard.probes.sample_sheet import (
    GAP,
    NONFINITE_RGB,
    PER_SHEET,
    SIDE,
    display_range,
    draw,
    png_bytes,
)


def decode_png(data: bytes) -> np.ndarray:
    """A minimal reader for the 8-bit RGB, unfiltered PNGs `png_bytes` writes."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF
        chunks[kind] = chunks.get(kind, b"") + body
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, colour) == (8, 2) and b"IEND" in chunks
    rows = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), dtype=np.uint8)
    rows = rows.reshape(height, 1 + 3 * width)
    assert not rows[:, 0].any()  # filter byte 0 on every row
    return rows[:, 1:].reshape(height, width, 3)


def test_the_png_decodes_to_the_pixels() -> None:
    pixels = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    assert np.array_equal(decode_png(png_bytes(pixels)), pixels)


def test_bad_pixels_are_refused() -> None:
    with pytest.raises(ValueError):
        png_bytes(np.zeros((4, 4), dtype=np.uint8))


def test_the_range_maps_to_black_and_white_and_nan_to_magenta() -> None:
    images = torch.zeros(2, 3, 4, 4)
    images[0] = -1.0
    images[1] = 1.0
    images[1, :, 0, 0] = float("nan")
    images[1, 0, 1, 1] = float("inf")
    strip = draw(images, -1.0, 1.0)
    assert strip.shape == (4, 2 * 4 + GAP, 3)
    assert (strip[:, :4] == 0).all()  # the first image at the range's bottom
    second = strip[:, 4 + GAP:]
    assert tuple(second[0, 0]) == NONFINITE_RGB and tuple(second[1, 1]) == NONFINITE_RGB
    assert (second[2:, 2:] == 255).all()
    assert (strip[:, 4:4 + GAP] == 255).all()  # the gap


def test_big_images_shrink_and_only_the_first_few_are_drawn() -> None:
    images = torch.rand(PER_SHEET + 3, 1, 3 * SIDE, 2 * SIDE)
    strip = draw(images, 0.0, 1.0)
    assert strip.shape == (SIDE, PER_SHEET * (2 * SIDE // 3 + 1) + (PER_SHEET - 1) * GAP, 3)
    assert (strip[..., 0] == strip[..., 1]).all()  # one channel: grey


def test_a_block_with_a_nan_stays_magenta_when_shrunk() -> None:
    images = torch.zeros(1, 3, 2 * SIDE, 2 * SIDE)
    images[0, 1, 5, 5] = float("nan")
    strip = draw(images, 0.0, 1.0)
    assert tuple(strip[2, 2]) == NONFINITE_RGB and tuple(strip[3, 3]) == (0, 0, 0)


def test_the_display_range_is_the_finite_range() -> None:
    images = torch.tensor([[[[0.2, float("nan")], [-0.5, 0.7]]]])
    assert display_range(images) == pytest.approx((-0.5, 0.7))
    assert display_range(torch.full((1, 1, 2, 2), float("nan"))) == (0.0, 1.0)
    assert display_range(torch.full((1, 1, 2, 2), 3.0)) == (2.5, 3.5)
