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
