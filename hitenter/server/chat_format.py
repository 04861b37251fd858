"""What a served model writes besides its answer, and how a reply is split back into its parts.

``chat_format_of(tokenizer)`` (cached per tokenizer): the model's reasoning format (or None), its
tool-call parser class, and the template's variables for thinking. ``ReplyParser`` runs one reply's
text through the reasoning parser, then its content through the tool-call parser, and yields
``Thought`` (reasoning text), ``str`` (content) and ``ToolDelta`` (calls) as they become certain.

Thinking is switched through the template, as the peers do: ``think`` True / False sets the
template's ``enable_thinking`` (Qwen3, SmolLM3, GLM, Gemma 4, DeepSeek) and ``thinking`` (Granite);
a level ("low" / "medium" / "high") sets ``reasoning_effort`` (gpt-oss) and turns thinking on. With
no choice thinking is on, as llama-server's default. Thinking from earlier turns comes in as a
message's ``reasoning_content`` and is handed to the template under the names it reads
(``reasoning_content``, ``thinking``, ``reasoning``).
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hitenter.sampling_params import ThinkingSpec
from hitenter.server.reasoning import ReasoningFormat, ReasoningParser, reasoning_parser_for
from hitenter.server.reasoning.harmony import HarmonyReasoningParser
from hitenter.server.tool_parsers import ToolDelta, ToolParser, tool_parser_for
from hitenter.server.tool_parsers.hermes import HermesToolParser

_READS = re.compile(r"message(?:\.|\[['\"]|\.get\(['\"])(reasoning_content|thinking|reasoning)\b")


@dataclass(frozen=True)
class ChatFormat:
    reasoning: ReasoningFormat | None
    tool_parser: type[ToolParser]
    template: str
    reasoning_keys: tuple[str, ...]          # the message fields the template reads earlier thinking from

    @property
    def thinks(self) -> bool:
        return self.reasoning is not None

    def template_kwargs(self, think: bool | None, effort: str | None) -> dict[str, Any]:
        """The template variables that switch thinking (none for a model without thinking)."""
        if self.reasoning is None:
            return {}
        on = think if think is not None else True
        kw: dict[str, Any] = {"enable_thinking": on, "thinking": on}
        if effort is not None and "reasoning_effort" in self.template:
            kw["reasoning_effort"] = effort
        return kw

    def thinking_on(self, template_vars: dict[str, Any]) -> bool:
        """Whether a prompt rendered with these template variables lets the reply think."""
        return self.reasoning is not None and template_vars.get("enable_thinking", True) is not False

    def thinking_spec(self, tokenizer: Any, budget: int | None, gated: bool) -> ThinkingSpec | None:
        """The reply's thinking section in token ids, for the engine (None when nothing is to be done):
        ``budget`` tokens at most (None: unbounded), ``gated``: a forced call's grammar waits for the
        section to close. Harmony's analysis message is closed by ``<|end|>``, and its budget writes the
        final channel's header after it; with a grammar, the section ends at the next message's
        ``<|start|>assistant``, where the call's ``<|channel|>`` header follows."""
        r = self.reasoning
        if r is None or (budget is None and not gated):
            return None

        def ids(text: str) -> tuple[int, ...]:
            return tuple(tokenizer.encode(text, add_bos=False))
        if r.cls is HarmonyReasoningParser:
            end = ids("<|end|><|start|>assistant") if gated else ids("<|end|>")
            return ThinkingSpec(ids(r.start), end, end if gated else ids(r.cls.end_tag), budget)
        return ThinkingSpec(ids(r.start), ids(r.end), budget=budget)

    def with_reasoning(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Messages whose ``reasoning_content`` is also under each name the template reads it by."""
        out = []
        for msg in messages:
            text = msg.get("reasoning_content")
            msg = {k: v for k, v in msg.items() if k != "reasoning_content"}
            if text:
                msg.update({k: text for k in self.reasoning_keys})
            out.append(msg)
        return out


_CACHE: dict[int, tuple[weakref.ref[Any], ChatFormat]] = {}
_LOCK = threading.RLock()      # reentrant: a collected tokenizer's callback may run inside it


def chat_format_of(tokenizer: Any) -> ChatFormat:
    """The chat format of a tokenizer's model (its vocabulary read once; the entry goes with the
    tokenizer, so a model the server unloads leaves nothing here)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    key = id(tokenizer)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None and hit[0]() is tokenizer and hit[1].template == template:
            return hit[1]
    vocab = {tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)} if hasattr(tokenizer, "id_to_piece") else set()
    fmt = ChatFormat(reasoning_parser_for(template, vocab), tool_parser_for(template) if template else HermesToolParser,
                     template, tuple(sorted(set(_READS.findall(template)))))
    with _LOCK:
        _CACHE[key] = (weakref.ref(tokenizer, lambda _: _forget(key)), fmt)
    return fmt


def _forget(key: int) -> None:
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None and hit[0]() is None:
            del _CACHE[key]


@dataclass
class Thought:
    text: str


Out = str | Thought | ToolDelta


class ReplyParser:
    """One reply's reasoning, content and calls (see the module docstring). ``tools`` None: calls are
    not parsed (the content is the text as it comes)."""

    def __init__(self, reasoning: ReasoningParser | None, tools: ToolParser | None) -> None:
        self.r, self.t = reasoning, tools
        self.reasoning: list[str] = []
        self.raw_content: list[str] = []

    @property
    def needs_special(self) -> bool:
        return bool(self.r and self.r.needs_special) or bool(self.t and self.t.needs_special)

    @property
    def in_thought(self) -> bool:
        return self.r is not None and self.r.in_thought

    def count(self, token_texts: Sequence[str]) -> int:
        """How many of a reply's tokens (their texts, in order) were written inside the thinking section
        (this parser is used up)."""
        n = 0
        for text in token_texts:
            before = self.in_thought
            outs = self.feed(text)
            n += before or self.in_thought or any(isinstance(o, Thought) for o in outs)
        return n

    def feed(self, delta: str) -> list[Out]:
        return list(self._route(*(self.r.feed(delta) if self.r else ("", delta)), final=False))

    def finish(self) -> list[Out]:
        return list(self._route(*(self.r.finish() if self.r else ("", "")), final=True))

    def _route(self, thought: str, content: str, final: bool) -> Iterator[Out]:
        if thought:
            self.reasoning.append(thought)
            yield Thought(thought)
        if content:
            self.raw_content.append(content)
        if self.t is None:
            if content:
                yield content
            return
        yield from self.t.feed(content) if content else []
        if final:
            yield from self.t.finish()

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning)

    @property
    def content(self) -> str:
        return self.t.content if self.t is not None else "".join(self.raw_content)

    @property
    def calls(self) -> list[dict[str, Any]]:
        return self.t.calls if self.t is not None else []

    def split(self, text: str) -> tuple[str, str, list[dict[str, Any]]]:
        """(reasoning, content, calls) of a whole reply."""
        self.feed(text)
        self.finish()
        return self.reasoning_text, self.content, self.calls
