"""The pixels of one image as an API or a Python caller gives it, under limits (image_input.py).

Contract: image_rgb(source, limits) -> [H, W, 3] uint8 RGB, or ImageInputError (a ValueError). Sources:
- an OpenAI `image_url` part ({"image_url": {"url": ...}} or a string), a Responses `input_image` part
  ({"image_url": ...}), an OpenAI-style {"type": "image", "image": ...} part: `data:` URLs only, remote
  URLs are refused (nothing is fetched);
- an Anthropic image block ({"source": {"type": "base64", "media_type", "data"}}), its MIME type checked
  against the data;
- a base64 string (Ollama's `images`) or raw bytes;
- for Python callers: a numpy [H, W, 3] uint8 array or a PIL image (its size checked, then converted).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from PIL import Image

from hitenter.models.vision.image_input import (
    DEFAULT_LIMITS,
    MIME_FORMATS,
    ImageInputError,
    ImageLimits,
    _check_size,
    decode_base64,
    decode_data_url,
    decode_image,
)


def image_rgb(source: Any, limits: ImageLimits = DEFAULT_LIMITS) -> np.ndarray:
    """See the module contract."""
    if isinstance(source, Mapping):
        return _from_part(source, limits)
    if isinstance(source, np.ndarray):
        return _from_array(source, limits)
    if isinstance(source, Image.Image):
        _check_size(source.width, source.height, limits)
        return np.asarray(source.convert("RGB"), dtype=np.uint8).copy()
    if isinstance(source, (bytes, bytearray, memoryview)):
        return decode_image(bytes(source), limits)
    if isinstance(source, str):
        if source.startswith("data:"):
            data, mime = decode_data_url(source, limits)
            return decode_image(data, limits, mime)
        if source.split(":", 1)[0].lower() in ("http", "https", "file", "ftp"):
            raise ImageInputError("remote image URLs are not fetched: send the image as a base64 data: URL")
        return decode_image(decode_base64(source, limits), limits)
    raise ImageInputError(f"an image must be a data: URL, base64 data or an image block, got {type(source).__name__}")


def _from_part(part: Mapping[str, Any], limits: ImageLimits) -> np.ndarray:
    src = part.get("source")
    if isinstance(src, Mapping):   # Anthropic
        kind = src.get("type")
        if kind != "base64":
            raise ImageInputError(f"image source type {kind!r} is not accepted: send type 'base64' (remote "
                                  "URLs and files are not fetched)")
        mime = str(src.get("media_type") or "").lower()
        if mime not in MIME_FORMATS:
            raise ImageInputError(f"unsupported image media_type {mime or '(none)'!r} "
                                  f"(accepted: {', '.join(sorted(set(MIME_FORMATS) - {'image/jpg'}))})")
        return decode_image(decode_base64(src.get("data"), limits), limits, mime)
    for key in ("image_url", "image", "url"):
        if key in part:
            value = part[key]
            if isinstance(value, Mapping):
                value = value.get("url")
            if value is None:
                break
            return image_rgb(value, limits)
    if part.get("file_id"):
        raise ImageInputError("image file_id references are not supported: send the image as a data: URL")
    raise ImageInputError(f"the {part.get('type', 'image')} part holds no image (image_url / source / image)")


def _from_array(arr: np.ndarray, limits: ImageLimits) -> np.ndarray:
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
        raise ImageInputError(f"an image array must be [H, W, 3] uint8 RGB, got {arr.dtype} {arr.shape}")
    _check_size(arr.shape[1], arr.shape[0], limits)
    return np.ascontiguousarray(arr)
