"""image_parts finds images in each API's message shape (hitenter/models/vision/content.py)."""

from __future__ import annotations

from hitenter.models.vision.content import image_parts


def test_image_parts_in_every_shape() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]},
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "AA=="}}]},
        {"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA=="}]},
        {"role": "user", "content": "look", "images": ["AA==", "AA=="]},
        "not a message",
    ]
    assert image_parts(messages) == [
        ("messages[1].content[1]", "image_url"), ("messages[2].content[0]", "image"),
        ("messages[3].content[0]", "input_image"), ("messages[4].images[0]", "images"),
        ("messages[4].images[1]", "images"),
    ]


def test_no_images() -> None:
    assert image_parts([{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                        {"role": "user", "content": "image_url", "images": None}]) == []
