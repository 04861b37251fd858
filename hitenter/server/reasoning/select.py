"""Which reasoning parser a model gets, read off its chat template and vocabulary.

``reasoning_parser_for(template, vocab)`` -> a ``ReasoningFormat`` (the parser class and its tags), or
None when the model has no thinking section. ``vocab``: the vocabulary's token texts (a tag that is a
single token of the model is a sure sign; a template that only mentions a tag in prose is not enough
for the generic parser). ``ReasoningFormat.parser(prompt_tail)`` makes one reply's parser: the section
counts as opened when the prompt's end holds a start tag not closed after it.
"""

from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import dataclass

from hitenter.server.reasoning.base import ReasoningParser
from hitenter.server.reasoning.harmony import HarmonyReasoningParser
from hitenter.server.reasoning.tags import (
    DeepSeekR1ReasoningParser,
    Gemma4ReasoningParser,
    GraniteReasoningParser,
    LFM2ReasoningParser,
    Qwen3ReasoningParser,
    SmolLM3ReasoningParser,
    TagReasoningParser,
)

_GENERIC = re.compile(r"<([A-Za-z_:]*think[A-Za-z_]*)>")


@dataclass(frozen=True)
class ReasoningFormat:
    cls: type[ReasoningParser]
    start: str = "<think>"
    end: str = "</think>"

    @property
    def name(self) -> str:
        return self.cls.name

    def parser(self, prompt_tail: str = "") -> ReasoningParser:
        opened = self.opens(prompt_tail)
        if self.cls is TagReasoningParser:
            return TagReasoningParser(opened, self.start, self.end)
        return self.cls(opened)

    def opens(self, prompt_tail: str) -> bool:
        """Whether a prompt ending in ``prompt_tail`` leaves the thinking section open."""
        if self.cls is HarmonyReasoningParser:
            return False
        at = prompt_tail.rfind(self.start)
        return at >= 0 and self.end not in prompt_tail[at:]


def _tag_family(template: str) -> type[TagReasoningParser]:
    if "<｜Assistant｜>" in template:
        return DeepSeekR1ReasoningParser
    if "SmolLM" in template or "/no_think" in template:
        return SmolLM3ReasoningParser
    if "<|tool_call_start|>" in template or "<|startoftext|>" in template or "LFM" in template:
        return LFM2ReasoningParser
    if "<|im_start|>" in template and ("enable_thinking" in template or "reasoning_content" in template):
        return Qwen3ReasoningParser
    return TagReasoningParser


def reasoning_parser_for(template: str | None, vocab: Container[str]) -> ReasoningFormat | None:
    """The reasoning format of a model with this chat template and vocabulary (None: no thinking)."""
    if not template:
        return None
    if "<|channel|>" in template and "<|message|>" in template:
        return ReasoningFormat(HarmonyReasoningParser, "<|channel|>analysis<|message|>", "<|end|>")
    if "<|channel>" in template and "<channel|>" in template:
        return ReasoningFormat(Gemma4ReasoningParser, Gemma4ReasoningParser.start, Gemma4ReasoningParser.end_tag)
    if "<think>" in template and "</think>" in template:
        if "<|start_of_role|>" in template:
            return ReasoningFormat(GraniteReasoningParser)
        return ReasoningFormat(_tag_family(template))
    for m in _GENERIC.finditer(template):
        start, end = m.group(0), f"</{m.group(1)}>"
        if end in template and (start in vocab or end in vocab):
            return ReasoningFormat(TagReasoningParser, start, end)
    return None
