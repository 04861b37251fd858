"""Turning untrusted image bytes into RGB pixels under limits, with Pillow.

Contract: decode_image(data, limits) -> an [H, W, 3] uint8 array (the first frame; alpha dropped, grey and
palette images expanded, as llama.cpp's stb_image loading with 3 channels does). Every bad input is an
ImageInputError (a ValueError, so a 400 on the APIs), raised before any large allocation:
  - more than limits.max_bytes bytes (checked before Pillow sees the data),
  - a format outside limits.formats (only those decoders are tried; the MIME type of a data URL must agree),
  - width x height over limits.max_pixels, or a side over limits.max_side (read from the header, before the
    pixels are decoded: a decompression bomb is refused unopened; Pillow's own MAX_IMAGE_PIXELS guard
    stays on behind it),
  - truncated or malformed data (Pillow's decoder errors).
decode_data_url(url) -> (bytes, mime) for `data:image/...;base64,...` URLs; other schemes are refused.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import BmpImagePlugin, GifImagePlugin, Image, JpegImagePlugin, PngImagePlugin, WebPImagePlugin

# The decoders of ImageLimits' formats, registered at import: Image.open then never falls back to importing
# every Pillow plugin (tens of modules) on the first request whose bytes match none of them.
_PLUGINS = (BmpImagePlugin, GifImagePlugin, JpegImagePlugin, PngImagePlugin, WebPImagePlugin)

MIME_FORMATS: dict[str, str] = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG",
                                "image/webp": "WEBP", "image/gif": "GIF", "image/bmp": "BMP"}
_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,",
                       re.ASCII)


class ImageInputError(ValueError):
    """An image that cannot be accepted: too big, an unknown format, truncated or malformed."""


@dataclass(frozen=True)
class ImageLimits:
    """What one image may be: bytes before decoding, pixels and side length from its header, formats."""
    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000
    max_side: int = 16384
    formats: tuple[str, ...] = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


DEFAULT_LIMITS = ImageLimits()


def decode_data_url(url: str, limits: ImageLimits = DEFAULT_LIMITS) -> tuple[bytes, str]:
    """The bytes and MIME type of a base64 `data:` URL holding an image; anything else is refused (no
    network fetches). The encoded length is checked against limits.max_bytes before decoding."""
    if not isinstance(url, str):
        raise ImageInputError("an image URL must be a string")
    m = _DATA_URL.match(url)
    if m is None:
        scheme = url.split(":", 1)[0][:16] if ":" in url else "(none)"
        raise ImageInputError(f"only base64 data: URLs are accepted for images (got the scheme {scheme!r}); "
                              "remote image URLs are not fetched")
    if not m.group("b64"):
        raise ImageInputError("an image data: URL must be base64-encoded (';base64,')")
    mime = (m.group("mime") or "").lower()
    if mime not in MIME_FORMATS:
        raise ImageInputError(f"unsupported image type {mime or '(none)'!r} "
                              f"(accepted: {', '.join(sorted(set(MIME_FORMATS) - {'image/jpg'}))})")
    return decode_base64(url[m.end():], limits), mime


def decode_base64(text: str, limits: ImageLimits = DEFAULT_LIMITS) -> bytes:
    """Strict base64 (whitespace allowed) to bytes; the decoded size is bounded before decoding."""
    if not isinstance(text, str):
        raise ImageInputError("image data must be a base64 string")
    compact = "".join(text.split())
    if len(compact) // 4 * 3 > limits.max_bytes + 3:
        raise ImageInputError(f"the image is over {limits.max_bytes} bytes")
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise ImageInputError("the image data is not valid base64") from None


def decode_image(data: bytes, limits: ImageLimits = DEFAULT_LIMITS, mime: str | None = None) -> np.ndarray:
    """The [H, W, 3] uint8 RGB pixels of `data` (see the module's contract)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ImageInputError("image data must be bytes")
    if len(data) == 0:
        raise ImageInputError("the image is empty")
    if len(data) > limits.max_bytes:
        raise ImageInputError(f"the image is {len(data)} bytes, over the limit of {limits.max_bytes}")
    formats = list(limits.formats)
    if mime is not None:
        fmt = MIME_FORMATS.get(mime.lower())
        if fmt is None or fmt not in formats:
            raise ImageInputError(f"unsupported image type {mime!r}")
        formats = [fmt]
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            img = Image.open(io.BytesIO(bytes(data)), formats=formats)
        except Image.UnidentifiedImageError:
            raise ImageInputError("the data is not an image in an accepted format "
                                  f"({', '.join(formats)})") from None
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            raise ImageInputError(f"the image is too large: {e}") from None
        except (OSError, SyntaxError, ValueError) as e:
            raise ImageInputError(f"the image is malformed: {e}") from None
        with img:
            _check_size(img.width, img.height, limits)
            try:
                img.load()
                rgb = img.convert("RGB")
            except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
                raise ImageInputError(f"the image is too large: {e}") from None
            except (OSError, SyntaxError, ValueError, EOFError) as e:
                raise ImageInputError(f"the image is truncated or malformed: {e}") from None
    return np.asarray(rgb, dtype=np.uint8).copy()


def _check_size(width: int, height: int, limits: ImageLimits) -> None:
    if width <= 0 or height <= 0:
        raise ImageInputError(f"the image has no pixels ({width}x{height})")
    if width > limits.max_side or height > limits.max_side:
        raise ImageInputError(f"the image is {width}x{height}, a side over {limits.max_side} pixels")
    if width * height > limits.max_pixels:
        raise ImageInputError(f"the image is {width}x{height} = {width * height} pixels, over the limit of "
                              f"{limits.max_pixels}")
