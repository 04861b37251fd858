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


def test_with_markers_joins_as_llama_cpp_server() -> None:
    """Text parts joined by newlines, none next to an image's marker (llama.cpp common_chat_msg::
    to_json_oaicompat); Ollama's images before the text; messages without images untouched."""
    from hitenter.models.vision.content import with_markers

    img = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}, img,
                                     {"type": "text", "text": "c"}, img, img]},
        {"role": "user", "content": "look", "images": ["AA==", "BB=="]},
        {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
    ]
    out, found = with_markers(messages, "<M>")
    assert [m["content"] for m in out] == ["be brief", "a\nb<M>c<M><M>", "<M><M>look", messages[3]["content"]]
    assert "images" not in out[2] and [w for w, _ in found] == [
        "messages[1].content[2]", "messages[1].content[4]", "messages[1].content[5]",
        "messages[2].images[0]", "messages[2].images[1]"]
    assert found[3][1] == "AA==" and found[0][1] is img


def test_unknown_parts_beside_an_image_are_refused() -> None:
    import pytest

    from hitenter.models.vision.content import with_markers

    img = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    with pytest.raises(ValueError, match=r"messages\[0\].content\[1\]: unsupported content part type 'audio'"):
        with_markers([{"role": "user", "content": [img, {"type": "audio"}]}], "<M>")
