"""Image bytes to pixels under limits (hitenter/models/vision/image_input.py): exact pixels for lossless
formats, and an ImageInputError (a ValueError, a 400 on the APIs) for every bad input, quickly."""

from __future__ import annotations

import base64
import io
import struct
import time
import zlib

import numpy as np
import pytest
from PIL import Image

from hitenter.models.vision.image_input import (
    ImageInputError,
    ImageLimits,
    decode_base64,
    decode_data_url,
    decode_image,
)
from hitenter.testing.tiny_vision import sample_image


def _encode(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (8-bit RGB) and whose data is a few bytes of zeros."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def test_png_pixels_are_exact() -> None:
    rgb = sample_image(33, 21, 7)
    assert np.array_equal(decode_image(_encode(Image.fromarray(rgb), "PNG")), rgb)


def test_modes_become_rgb() -> None:
    rgba = np.dstack([sample_image(8, 6, 1), np.full((6, 8), 7, np.uint8)])
    assert np.array_equal(decode_image(_encode(Image.fromarray(rgba, "RGBA"), "PNG")), rgba[..., :3])
    grey = np.arange(48, dtype=np.uint8).reshape(6, 8)
    out = decode_image(_encode(Image.fromarray(grey, "L"), "PNG"))
    assert out.shape == (6, 8, 3) and np.array_equal(out[..., 1], grey)
    jpeg = decode_image(_encode(Image.fromarray(sample_image(16, 16, 2)), "JPEG"), mime="image/jpeg")
    assert jpeg.shape == (16, 16, 3) and jpeg.dtype == np.uint8


@pytest.mark.parametrize("data, limits, match", [
    (b"", ImageLimits(), "empty"),
    (b"hello, I am not an image", ImageLimits(), "not an image"),
    (b"x" * 101, ImageLimits(max_bytes=100), "over the limit"),
    (_png_header(100_000, 100_000), ImageLimits(), "too large|pixels, over the limit"),
    (_png_header(9000, 9000), ImageLimits(), "pixels, over the limit"),
    (_png_header(20_000, 2), ImageLimits(), "side over"),
    (_png_header(300, 300), ImageLimits(), "truncated or malformed"),
])
def test_bad_images_are_refused_quickly(data: bytes, limits: ImageLimits, match: str) -> None:
    start = time.perf_counter()
    with pytest.raises(ImageInputError, match=match):
        decode_image(data, limits)
    assert time.perf_counter() - start < 1.0


def test_truncated_png_is_refused() -> None:
    data = _encode(Image.fromarray(sample_image(64, 64, 3)), "PNG")
    with pytest.raises(ImageInputError, match="truncated|malformed"):
        decode_image(data[: len(data) // 2])


def test_format_must_be_allowed_and_match_the_mime_type() -> None:
    png = _encode(Image.fromarray(sample_image(8, 8, 1)), "PNG")
    with pytest.raises(ImageInputError, match="not an image in an accepted format"):
        decode_image(png, ImageLimits(formats=("JPEG",)))
    with pytest.raises(ImageInputError, match="not an image in an accepted format"):
        decode_image(png, mime="image/jpeg")
    with pytest.raises(ImageInputError, match="unsupported image type"):
        decode_image(png, mime="image/svg+xml")
    assert issubclass(ImageInputError, ValueError)


def test_data_urls() -> None:
    png = _encode(Image.fromarray(sample_image(8, 8, 1)), "PNG")
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    assert decode_data_url(url) == (png, "image/png")
    with pytest.raises(ImageInputError, match="remote image URLs are not fetched"):
        decode_data_url("https://example.com/cat.png")
    with pytest.raises(ImageInputError, match="base64"):
        decode_data_url("data:image/png,rawbytes")
    with pytest.raises(ImageInputError, match="unsupported image type"):
        decode_data_url("data:text/html;base64,PGI+")
    with pytest.raises(ImageInputError, match="not valid base64"):
        decode_data_url("data:image/png;base64,@@@@")
    with pytest.raises(ImageInputError, match="over 10 bytes"):
        decode_base64("A" * 400, ImageLimits(max_bytes=10))
