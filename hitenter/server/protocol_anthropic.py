"""Anthropic Messages' request bodies (POST /v1/messages, /v1/messages/count_tokens) and their content
blocks, turned into the chat template's messages.

Blocks: ``text``, ``tool_use`` (an earlier call of the model) and ``tool_result`` (its result, a string
or text blocks; ``is_error`` kept in the text). ``cache_control`` is accepted on blocks, tools and the
system prompt and has no effect (the prefix cache is automatic here). ``thinking`` blocks of earlier
turns go back to the template as the turn's reasoning; ``thinking: {type: enabled}`` asks for the
reply's thinking (``thinking`` blocks, ``thinking_delta`` events; their ``signature`` is empty: nothing
here signs them); its ``budget_tokens`` (below ``max_tokens``) bounds the section: the engine writes
the model's end tag when it is spent (hitenter/engine/thinking_gate.py). Images, documents, server tools and MCP servers are refused (400). ``output_config.format`` (a JSON schema) constrains
the reply (structured outputs). ``temperature`` is 0..1 as Anthropic documents it (default 1; newer
SDKs no longer send sampling fields, older ones and plain HTTP do), ``metadata.user_id`` is metadata.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from annotated_types import Interval, MinLen
from pydantic import ConfigDict, Discriminator, Field, Tag

from hitenter.server.schema_types import STRICT, Bool, NonEmpty, PositiveInt, TopP
from hitenter.server.schema_types import Nested as _Nested

UnitFloat = Annotated[float, Interval(ge=0, le=1), STRICT]


class CacheControl(_Nested):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(_Nested):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: None = None


class ToolUseBlock(_Nested):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    # the SDK's own fields of a block it received, as a client sends it back (model_dump): only empty
    caller: None = None
    toolset_name: None = None


class ToolResultBlock(_Nested):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: Bool | None = None
    cache_control: CacheControl | None = None

    def text(self) -> str:
        c = self.content
        body = c if isinstance(c, str) else "".join(b.text for b in c or [])
        return f"Error: {body}" if self.is_error else body


class ThinkingBlock(_Nested):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None

    @property
    def text(self) -> str:
        return ""


class ImageBlock(_Nested):
    """An image: ``source`` {"type": "base64", "media_type", "data"} (hitenter/server/image_chat.py checks it;
    url and file sources are refused: nothing is fetched)."""
    type: Literal["image"]
    source: dict[str, Any]
    cache_control: CacheControl | None = None


def _block_kind(v: Any) -> str | None:
    t = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return t if t in ("text", "tool_use", "tool_result", "thinking", "image") else None


Block = Annotated[Annotated[TextBlock, Tag("text")] | Annotated[ToolUseBlock, Tag("tool_use")]
                  | Annotated[ToolResultBlock, Tag("tool_result")] | Annotated[ThinkingBlock, Tag("thinking")]
                  | Annotated[ImageBlock, Tag("image")],
                  Discriminator(_block_kind, custom_error_type="unsupported_block", custom_error_message=(
                      "unsupported content block (document, server tool and MCP blocks are not "
                      "supported here): give text, image, thinking, tool_use or tool_result blocks"))]


class Message(_Nested):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolDef(_Nested):
    name: NonEmpty
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None

    def as_openai(self) -> dict[str, Any]:
        fn = {"name": self.name, "description": self.description, "parameters": self.input_schema}
        return {"type": "function", "function": {k: v for k, v in fn.items() if v is not None}}


class ToolChoice(_Nested):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: Bool | None = None

    def as_openai(self) -> Any:
        """tools.plan_tools's spelling: auto / required / a named function / none."""
        if self.type == "tool":
            return {"type": "function", "function": {"name": self.name or ""}}
        return {"auto": "auto", "any": "required", "none": "none"}[self.type]


class Thinking(_Nested):
    """``enabled`` (with Anthropic's ``budget_tokens``) switches the model's thinking on through its
    template and returns it as ``thinking`` blocks; ``disabled`` (the default) switches it off."""
    type: Literal["enabled", "disabled"]
    budget_tokens: PositiveInt | None = None



class Metadata(_Nested):
    user_id: str | None = None


class OutputFormat(_Nested):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Nested):
    """Structured outputs (``format``: a JSON schema the reply follows); ``effort`` only null."""
    format: OutputFormat | None = None
    effort: None = None


class _Conversation(_Nested):
    model: NonEmpty
    messages: Annotated[list[Message], MinLen(1)]
    system: str | list[TextBlock] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None

    def system_text(self) -> str | None:
        s = self.system
        return s if isinstance(s, str) or s is None else "".join(b.text for b in s)

    def template_messages(self) -> list[dict[str, Any]]:
        """System first; a user turn's tool results become ``tool`` messages (before its text), an
        assistant turn's tool_use blocks its ``tool_calls`` (arguments as objects); ids lose the
        ``toolu_`` this surface put on the model's own call ids (some templates check their form)."""
        out: list[dict[str, Any]] = []
        if self.system_text():
            out.append({"role": "system", "content": self.system_text()})
        for msg in self.messages:
            blocks = [TextBlock(type="text", text=msg.content)] if isinstance(msg.content, str) else msg.content
            text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
            out += [{"role": "tool", "content": b.text(), "tool_call_id": b.tool_use_id.removeprefix("toolu_")}
                    for b in blocks if isinstance(b, ToolResultBlock)]
            calls = [{"id": b.id.removeprefix("toolu_"), "type": "function",
                      "function": {"name": b.name, "arguments": b.input}}
                     for b in blocks if isinstance(b, ToolUseBlock)]
            thought = "".join(b.thinking for b in blocks if isinstance(b, ThinkingBlock))
            if any(isinstance(b, ImageBlock) for b in blocks):   # text and images in order (image_chat.py)
                text = [{"type": "text", "text": b.text} if isinstance(b, TextBlock) else b.model_dump(exclude_none=True)
                        for b in blocks if isinstance(b, (TextBlock, ImageBlock))]
            if text or calls or not any(isinstance(b, ToolResultBlock) for b in blocks):
                out.append({"role": msg.role, "content": text, **({"tool_calls": calls} if calls else {}),
                            **({"reasoning_content": thought} if thought and msg.role == "assistant" else {})})
        return out

    def tools_openai(self) -> list[dict[str, Any]]:
        return [t.as_openai() for t in self.tools or []]


class MessagesRequest(_Conversation):
    max_tokens: PositiveInt
    stop_sequences: list[NonEmpty] | None = None
    temperature: UnitFloat | None = None
    top_p: TopP | None = None
    top_k: PositiveInt | None = None
    stream: Bool = False
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    output_config: OutputConfig | None = None
    cache_control: CacheControl | None = None


class CountTokensRequest(_Conversation):
    pass
