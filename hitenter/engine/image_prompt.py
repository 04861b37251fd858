"""A prompt holding images, laid out as llama.cpp's mtmd lays it out (tools/mtmd/mtmd.cpp, mtmd_tokenizer).

The text carries one MEDIA_MARKER per image, in order. The text is cut at the markers and each piece is
tokenized on its own (BOS only on the first, when asked); each image becomes the encoder's `image_begin`
text (tokenized on its own, special tokens parsed), `num_tokens` placeholder rows, then `image_end` (on its
own), as mtmd_tokenizer.add_media does. The placeholder rows hold `placeholder_id` (any valid id: the runner
puts the encoder's rows in their place) and are described by an ImageRun (hitenter/request.py).

Contracts: image_prompt(...) -> ImagePrompt(ids, runs); ValueError when the markers and the images differ in
number. chat_segments renders a conversation (whose image parts were replaced by MEDIA_MARKER text) into
the (text, markup) segments Tokenizer.apply_chat_template(tokenize=True) encodes, so message content keeps
its protection against forged control tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from hitenter.request import ImageRun
from hitenter.tokenizer.chat_template import render_chat_segments, render_chat_template

MEDIA_MARKER = "<__media__>"
Segment = tuple[str, bool]


class ImagePrompt(list):
    """Token ids (placeholders at image rows: a list of ints, so whatever reads a prompt's ids reads these)
    and the images' runs, in order (``runs``)."""

    def __init__(self, ids: Sequence[int], runs: Sequence[ImageRun]) -> None:
        super().__init__(ids)
        self.runs: tuple[ImageRun, ...] = tuple(runs)

    @property
    def ids(self) -> list[int]:
        return list(self)


def chat_segments(tokenizer: Any, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool,
                  special_in_content: bool = False, **kwargs: Any) -> list[Segment]:
    """The conversation rendered by the tokenizer's chat template as (text, is_markup) segments."""
    kwargs.setdefault("bos_token", tokenizer.id_to_piece(tokenizer.bos_token_id) if tokenizer.bos_token_id is not None else "")
    kwargs.setdefault("eos_token", tokenizer.id_to_piece(tokenizer.eos_token_id) if tokenizer.eos_token_id is not None else "")
    if special_in_content:
        return [(render_chat_template(tokenizer.chat_template, messages, add_generation_prompt, **kwargs), True)]
    return render_chat_segments(tokenizer.chat_template, messages, tokenizer.contains_special,
                                add_generation_prompt, **kwargs)


def _split(segments: Sequence[Segment]) -> list[list[Segment]]:
    """The segments cut at every marker: one group of segments per text piece (markers + 1 groups)."""
    groups: list[list[Segment]] = [[]]
    for text, markup in segments:
        pieces = text.split(MEDIA_MARKER)
        for k, piece in enumerate(pieces):
            if k:
                groups.append([])
            if piece:
                groups[-1].append((piece, markup))
    return groups


def image_prompt(tokenizer: Any, segments: Sequence[Segment], images: Sequence[Any], encoder: Any,
                 keys: Sequence[bytes], add_bos: bool | None, placeholder_id: int = 0) -> ImagePrompt:
    """Lay out `segments` (holding one MEDIA_MARKER per image) with `images` (the encoder's ImageInputs) and
    their content `keys` (see the module docstring); `add_bos` as Tokenizer.encode's (None: the GGUF's)."""
    groups = _split(segments)
    if len(groups) - 1 != len(images):
        raise ValueError(f"the prompt holds {len(groups) - 1} image markers ({MEDIA_MARKER}) for {len(images)} "
                         "images")
    # an empty first piece still takes the BOS (mtmd: a BOS chunk before a leading image)
    ids: list[int] = list(tokenizer.encode_segments(groups[0], add_bos=add_bos))
    runs: list[ImageRun] = []
    for image, key, group in zip(images, keys, groups[1:], strict=True):
        if encoder.image_begin:
            ids += tokenizer.encode(encoder.image_begin, add_bos=False)
        runs.append(ImageRun(len(ids), image.num_tokens, key, image, encoder.bidirectional))
        ids += [placeholder_id] * image.num_tokens
        if encoder.image_end:
            ids += tokenizer.encode(encoder.image_end, add_bos=False)
        if group:
            ids += tokenizer.encode_segments(group, add_bos=False)
    return ImagePrompt(ids, tuple(runs))


def with_prefix(prefix: list[int], prompt: list[int]) -> list[int]:
    """``prefix + prompt``, an ImagePrompt's runs moved along by the prefix (earlier context ids)."""
    if not isinstance(prompt, ImagePrompt):
        return prefix + list(prompt)
    if not prefix:
        return prompt
    k = len(prefix)
    return ImagePrompt(prefix + list(prompt), [replace(r, start=r.start + k) for r in prompt.runs])
