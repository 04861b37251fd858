"""image_rgb takes an image in every shape an API or a Python caller gives it, under limits
(hitenter/models/vision/image_source.py)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from hitenter.models.vision.image_input import ImageInputError, ImageLimits
from hitenter.models.vision.image_source import image_rgb
from hitenter.testing.tiny_vision import bad_images, data_url, image_base64, image_bytes, sample_image

RGB = sample_image(20, 12, 3)


@pytest.mark.parametrize("source", [
    data_url(RGB),
    {"type": "image_url", "image_url": {"url": data_url(RGB)}},
    {"type": "image_url", "image_url": data_url(RGB)},
    {"type": "input_image", "image_url": data_url(RGB)},
    {"type": "image", "image": data_url(RGB)},
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image_base64(RGB)}},
    image_base64(RGB),
    image_bytes(RGB),
    RGB,
    Image.fromarray(RGB),
])
def test_every_shape_gives_the_pixels(source: object) -> None:
    assert np.array_equal(image_rgb(source), RGB)


@pytest.mark.parametrize("name", sorted(bad_images()))
def test_bad_images(name: str) -> None:
    mime, data = bad_images()[name]
    with pytest.raises(ImageInputError):
        image_rgb(f"data:{mime};base64,{data}")
    with pytest.raises(ImageInputError):
        image_rgb({"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}})


@pytest.mark.parametrize("source, match", [
    ("https://example.com/a.png", "not fetched"),
    ({"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}, "base64"),
    ({"type": "input_image", "file_id": "file-1"}, "file_id"),
    ({"type": "image_url"}, "holds no image"),
    (np.zeros((4, 4), np.uint8), r"\[H, W, 3\] uint8"),
    (3, "got int"),
])
def test_refusals(source: object, match: str) -> None:
    with pytest.raises(ImageInputError, match=match):
        image_rgb(source)


def test_limits_apply_to_arrays_and_pil_images() -> None:
    small = ImageLimits(max_pixels=100)
    for source in (RGB, Image.fromarray(RGB)):
        with pytest.raises(ImageInputError, match="over the limit of 100"):
            image_rgb(source, small)
