"""A conversation holding images, as every API's chat path takes it (generation.chat_ids hands it here).

Images arrive as content parts in the messages (OpenAI `image_url`, Anthropic `image` blocks, Responses
`input_image`, the Python API's `image`) or as Ollama's `images` list on a message. Contract, in order:
- a model without a vision encoder: 400 naming the image and the fix (--mmproj);
- more than MAX_IMAGES images: 400, before any is decoded;
- refusals of images (too many, or one that fails to decode) are paced per client address (IMAGE_PACER:
  after IMAGE_PACE_FREE in 10 s, each further one answered IMAGE_PACE_DELAY_S late), so one client posting
  bad images back to back costs the server a few refusals a second, not hundreds, and its answers stay
  the same 4xx well within a second;
- each image decoded under ImageLimits (hitenter/models/vision/image_input.py: bytes checked before
  decoding, pixels and sides from the header, formats and MIME types; remote URLs refused, nothing is
  fetched): any failure is a 400 naming the image's place (`messages[1].content[0]`), never a 5xx;
- the conversation rendered with MEDIA_MARKER where each image was (text parts joined as llama.cpp's server
  joins them) and laid out by the engine (hitenter/engine/image_prompt.py): an ImagePrompt, a list of ids
  that carries the images' runs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hitenter.engine.image_prompt import MEDIA_MARKER, ImagePrompt
from hitenter.models.vision.content import image_parts, with_markers
from hitenter.models.vision.image_input import DEFAULT_LIMITS, ImageInputError, ImageLimits
from hitenter.models.vision.image_source import image_rgb
from hitenter.server.api_error import APIError
from hitenter.server.body_limits import RefusalPacer

MAX_IMAGES = 16   # images in one request
IMAGE_PACE_FREE, IMAGE_PACE_DELAY_S = 8, 0.1
IMAGE_PACER = RefusalPacer(free=IMAGE_PACE_FREE, window_s=10.0, delay_s=IMAGE_PACE_DELAY_S)


def _paced(err: APIError) -> APIError:
    """`err`, answered under IMAGE_PACER (api_error's handler reads the attribute)."""
    err.pacer = IMAGE_PACER   # type: ignore[attr-defined]
    return err


def _param(where: str, param: str) -> str:
    """Where an image is, as the request spells it: `messages[1].content[0]` on the chat APIs (their messages
    are the template's), `images[0]` on Ollama's /api/generate (param "prompt"), else the field itself (the
    Responses API's messages also hold earlier turns, so their indexes are not the request's)."""
    if param == "messages":
        return where
    if param == "prompt" and ".images[" in where:
        return where[where.index(".images[") + 1:]
    return param


def check_vision(m: Any, where: str, param: str) -> None:
    """400 unless the model `m` (a ServedModel) has a vision encoder loaded."""
    if not getattr(m.client.info, "vision", False):
        p = _param(where, param)
        raise APIError(400, f"{p}: the model `{m.name}` has no vision encoder loaded, so it cannot take images; "
                       "start the server with the model's projector file, --mmproj mmproj.gguf (or put its "
                       "mmproj*.gguf beside the model)", p)


def decode_images(images: list[tuple[str, Any]], param: str, limits: ImageLimits = DEFAULT_LIMITS) -> list[Any]:
    """Each image's RGB pixels; the first bad one is a 400 naming its place."""
    out = []
    for n, (where, source) in enumerate(images):
        try:
            out.append(image_rgb(source, limits))
        except ImageInputError as e:
            p = _param(where, param)
            raise _paced(APIError(400, f"{p}: image {n + 1} of {len(images)}: {e}", p)) from None
    return out


async def image_chat_ids(m: Any, messages: list[dict[str, Any]], add_generation_prompt: bool,
                         special_in_content: bool, param: str = "messages", **template_kw: Any) -> ImagePrompt:
    """The conversation's ImagePrompt (see the module contract)."""
    found = image_parts(messages)
    check_vision(m, found[0][0], param)
    if len(found) > MAX_IMAGES:
        raise _paced(APIError(400, f"{param}: {len(found)} images in one request, more than {MAX_IMAGES}", param))
    try:
        marked, images = with_markers(messages, MEDIA_MARKER)
    except ValueError as e:
        raise APIError(400, f"{param}: {e}", param) from None
    rgbs = await asyncio.to_thread(decode_images, images, param)
    try:
        return await asyncio.to_thread(m.client.image_prompt, marked, rgbs, add_generation_prompt,
                                       special_in_content, **template_kw)
    except ValueError as e:   # the template rejected the conversation, or markers and images differ
        raise APIError(400, f"{param}: {e}", param) from e
