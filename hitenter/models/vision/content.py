"""Finding the images in chat messages, in each API's shape: OpenAI `{"type": "image_url"}` and
`{"type": "image"}` content parts, Anthropic `{"type": "image", "source": ...}` blocks, Responses
`{"type": "input_image"}` parts, and Ollama's `images` list on a message.

Contract: image_parts(messages) -> [(where, kind)] in message order, `where` a JSON-path-like location
("messages[0].content[1]", "messages[2].images[0]") and `kind` the part's type; messages that are not
mappings, and string content, hold no images.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

IMAGE_PART_TYPES: frozenset[str] = frozenset({"image_url", "image", "input_image"})


def image_parts(messages: Sequence[Any]) -> list[tuple[str, str]]:
    """Where the images of `messages` are (see the module contract)."""
    found: list[tuple[str, str]] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            continue
        content = msg.get("content")
        if isinstance(content, Sequence) and not isinstance(content, (str, bytes)):
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, Mapping) else None
                if kind in IMAGE_PART_TYPES:
                    found.append((f"messages[{i}].content[{j}]", str(kind)))
        images = msg.get("images")
        if isinstance(images, Sequence) and not isinstance(images, (str, bytes)):
            found.extend((f"messages[{i}].images[{j}]", "images") for j in range(len(images)))
    return found


TEXT_PART_TYPES: frozenset[str] = frozenset({"text", "input_text", "output_text"})


def join_parts(parts: Sequence[Any], marker: str, param: str) -> tuple[str, list[tuple[str, Any]]]:
    """A content list as one string, joined as llama.cpp's server joins it (text parts by newlines, none
    next to an image's marker), each image part replaced by `marker`; and the image parts [(where, part)].
    ValueError for a part of another type."""
    text, images, last_marker = "", [], False
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in IMAGE_PART_TYPES:
            text += marker
            images.append((f"{param}[{j}]", part))
            last_marker = True
        elif kind in TEXT_PART_TYPES:
            if text and not last_marker:
                text += "\n"
            text += str(part.get("text") or "")
            last_marker = False
        else:
            raise ValueError(f"{param}[{j}]: unsupported content part type {kind!r}")
    return text, images


def with_markers(messages: Sequence[Any], marker: str) -> tuple[list[dict[str, Any]], list[tuple[str, Any]]]:
    """The messages with every image (content parts, Ollama's `images`, which go before the text) replaced
    by `marker` in a string content, and the images [(where, part or base64 string)] in order. Messages
    without images are kept as they are."""
    out: list[dict[str, Any]] = []
    found: list[tuple[str, Any]] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            out.append(msg)
            continue
        m = dict(msg)
        content = m.get("content")
        if isinstance(content, Sequence) and not isinstance(content, (str, bytes)) and any(
                isinstance(p, Mapping) and p.get("type") in IMAGE_PART_TYPES for p in content):
            m["content"], parts = join_parts(content, marker, f"messages[{i}].content")
            found += parts
        images = m.pop("images", None)
        if images:
            m["content"] = marker * len(images) + (m.get("content") or "")
            found += [(f"messages[{i}].images[{j}]", img) for j, img in enumerate(images)]
        out.append(m)
    return out, found
