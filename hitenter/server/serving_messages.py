"""Anthropic Messages: POST /v1/messages (system, content blocks, ``max_tokens``, ``stop_sequences``,
temperature / top_p / top_k, tools with tool_use / tool_result blocks and ``tool_choice`` auto / any /
tool / none, ``output_config.format`` structured outputs, streaming as named server-sent events) and POST /v1/messages/count_tokens. Errors in
Anthropic's shape (api_error.dialect_of); the key may come as ``x-api-key``.

Anthropic Messages' response body and event stream, built from a Reply.

Content: a ``text`` block (unless the reply is only tool calls), then a ``tool_use`` block per call
(``input`` an object, id ``toolu_...``). ``stop_reason``: ``tool_use`` when it called, ``max_tokens`` when
the budget ran out, ``stop_sequence`` (with ``stop_sequence`` set) when one matched, else ``end_turn``.
The stream is the documented sequence: ``message_start``, ``ping``, per block ``content_block_start``,
``content_block_delta``s (``thinking_delta``, ``text_delta``, or one ``input_json_delta`` with the whole
input of a call, sent as soon as the call is complete), ``content_block_stop``, then ``message_delta``
(stop reason, output tokens) and ``message_stop``.

Anthropic Messages' request bodies (POST /v1/messages, /v1/messages/count_tokens) and their content
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

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from annotated_types import Interval, MinLen
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ConfigDict, Discriminator, Field, Tag

from hitenter.sampling_params import SamplingParams
from hitenter.server import structured_fields as SF
from hitenter.server.api_error import APIError, error_responses
from hitenter.server.chat_format import chat_format_of
from hitenter.server.generation import (
    NAMED_SSE_ANTHROPIC,
    ServedModel,
    ServerState,
    Source,
    State,
    chat_ids,
    new_id,
    respond,
    sampling_params,
    submit,
)
from hitenter.server.reply import (
    NO_TOOLS,
    CallDone,
    Done,
    Piece,
    Reply,
    ToolPlan,
    bind,
    call_arguments,
    plan_tools,
    reply_events,
    reply_params,
    thinking_budget,
    with_tools,
)
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


def _block_kind(v: Any) -> str | None:
    t = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return t if t in ("text", "tool_use", "tool_result", "thinking") else None


Block = Annotated[Annotated[TextBlock, Tag("text")] | Annotated[ToolUseBlock, Tag("tool_use")]
                  | Annotated[ToolResultBlock, Tag("tool_result")] | Annotated[ThinkingBlock, Tag("thinking")],
                  Discriminator(_block_kind, custom_error_type="unsupported_block", custom_error_message=(
                      "unsupported content block (image, document, server tool and MCP blocks are not "
                      "supported here): give text, thinking, tool_use or tool_result blocks"))]


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


def stop_fields(r: Reply) -> dict[str, Any]:
    if r.calls:
        return {"stop_reason": "tool_use", "stop_sequence": None}
    if r.truncated:
        return {"stop_reason": "max_tokens", "stop_sequence": None}
    if r.stop_string is not None:
        return {"stop_reason": "stop_sequence", "stop_sequence": r.stop_string}
    return {"stop_reason": "end_turn", "stop_sequence": None}


def usage(r: Reply | None, prompt_tokens: int = 0) -> dict[str, Any]:
    if r is None:
        return {"input_tokens": prompt_tokens, "output_tokens": 0, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0}
    return {"input_tokens": r.prompt_tokens, "output_tokens": r.completion_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": r.cached_tokens}


def tool_use(call: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": call["function"]["name"],
            "input": call_arguments(call)}


def content(r: Reply, thinking: bool = False) -> list[dict[str, Any]]:
    """The reply's blocks: its thinking first (when asked for), text, tool_use."""
    head = [{"type": "thinking", "thinking": r.reasoning, "signature": ""}] if thinking and r.reasoning else []
    blocks = [{"type": "text", "text": r.content}] if r.content or not r.calls else []
    return head + blocks + [tool_use(c) for c in r.calls]


def message(msg_id: str, model: str, blocks: list[dict[str, Any]], stop: dict[str, Any],
            used: dict[str, Any]) -> dict[str, Any]:
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": blocks, **stop,
            "usage": used}


def body(model: str, r: Reply, thinking: bool = False) -> dict[str, Any]:
    return message(new_id("msg", "_"), model, content(r, thinking), stop_fields(r), usage(r))


async def stream_events(src: Source, model: str, plan: ToolPlan, prompt_tokens: int,
                        thinking: bool = False) -> AsyncIterator[dict[str, Any]]:
    """The documented event sequence of one message (see the module docstring): with ``thinking`` a
    ``thinking`` block (``thinking_delta`` events) first, then ``text_delta`` events, and each
    ``tool_use`` block as soon as its call is complete (its whole input in one ``input_json_delta``)."""
    start = message(new_id("msg", "_"), model, [], {"stop_reason": None, "stop_sequence": None}, usage(None, prompt_tokens))
    yield {"type": "message_start", "message": start}
    yield {"type": "ping"}
    blocks = _Blocks()
    async for e in reply_events(src, plan):
        if isinstance(e, CallDone):
            block = tool_use(e.call)
            for x in blocks.open("tool_use", {**block, "input": {}}):
                yield x
            yield blocks.delta({"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)})
            for x in blocks.close():
                yield x
        elif isinstance(e, Piece) and e.text and (thinking or not e.reasoning):
            kind = "thinking" if e.reasoning else "text"
            for x in blocks.open(kind, {"type": "thinking", "thinking": "", "signature": ""} if e.reasoning
                                 else {"type": "text", "text": ""}):
                yield x
            yield blocks.delta({"type": "thinking_delta", "thinking": e.text} if e.reasoning
                               else {"type": "text_delta", "text": e.text})
        elif isinstance(e, Done):
            r = e.reply
            for x in blocks.close():
                yield x
            if not blocks.any_text and not r.calls:     # an empty answer is one empty text block
                for x in [*blocks.open("text", {"type": "text", "text": ""}), *blocks.close()]:
                    yield x
            yield {"type": "message_delta", "delta": stop_fields(r), "usage": {"output_tokens": r.completion_tokens}}
            yield {"type": "message_stop"}


class _Blocks:
    """The content blocks of a message stream: one open at a time, numbered in order."""

    def __init__(self) -> None:
        self.index, self.kind, self.any_text = 0, None, False

    def open(self, kind: str, block: dict[str, Any]) -> list[dict[str, Any]]:
        if self.kind == kind and kind != "tool_use":
            return []
        out = self.close()
        self.kind = kind
        self.any_text |= kind == "text"
        return out + [{"type": "content_block_start", "index": self.index, "content_block": block}]

    def delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}

    def close(self) -> list[dict[str, Any]]:
        if self.kind is None:
            return []
        out = [self.delta({"type": "signature_delta", "signature": ""})] if self.kind == "thinking" else []
        out.append({"type": "content_block_stop", "index": self.index})
        self.index, self.kind = self.index + 1, None
        return out


router = APIRouter(responses=error_responses(400, 404, 413, 429))


_OK = {200: {"content": {"application/json": {}, "text/event-stream": {}},
             "description": "The message, or with `stream` its server-sent events"}}


def _plan(req: MessagesRequest | CountTokensRequest, template: str | None) -> ToolPlan:
    tools = req.tools_openai()
    if not tools and req.tool_choice is None:
        return NO_TOOLS
    choice = req.tool_choice.as_openai() if req.tool_choice is not None else None
    parallel = None if req.tool_choice is None else not req.tool_choice.disable_parallel_tool_use
    return plan_tools(tools, choice, parallel, template)


def thinking_on(m: ServedModel, req: MessagesRequest | CountTokensRequest) -> bool:
    """Whether the request asks for thinking (400 when the model has none)."""
    on = req.thinking is not None and req.thinking.type == "enabled"
    if on and not chat_format_of(m.tokenizer).thinks:
        raise APIError(400, f"thinking: the model `{m.name}` does not support thinking", "thinking")
    return on


def _budget(state: ServerState, req: MessagesRequest, thinking: bool) -> int | None:
    """``thinking.budget_tokens`` (below ``max_tokens``, as Anthropic requires), else the server's budget."""
    asked = req.thinking.budget_tokens if thinking and req.thinking is not None else None
    if asked is not None and asked >= req.max_tokens:
        raise APIError(400, f"thinking.budget_tokens: must be less than max_tokens ({req.max_tokens}), got {asked}",
                       "thinking.budget_tokens")
    return thinking_budget(state.reasoning_budget, asked)


async def _prompt(state: ServerState, m: ServedModel, req: MessagesRequest | CountTokensRequest,
                  plan: ToolPlan) -> list[int]:
    fmt = chat_format_of(m.tokenizer)
    return await chat_ids(state, m, fmt.with_reasoning(req.template_messages()), True,
                          **{**fmt.template_kwargs(thinking_on(m, req), None), **plan.template_kwargs()})


@router.post("/v1/messages", responses=_OK)
async def messages(req: MessagesRequest, request: Request, state: State) -> Response:
    m = await state.model_for(req.model)
    plan = _plan(req, m.tokenizer.chat_template)
    prompt = await _prompt(state, m, req, plan)
    fmt = req.output_config.format if req.output_config is not None else None
    spec = with_tools(SF.schema_spec(fmt.schema_, "output_config.format") if fmt is not None else None, plan)
    kw: dict[str, Any] = {"temperature": 1.0 if req.temperature is None else req.temperature,
                          "max_tokens": req.max_tokens, "stop": req.stop_sequences, "structured": spec}
    kw |= {k: v for k, v in (("top_p", req.top_p), ("top_k", req.top_k)) if v is not None}
    thinking = thinking_on(m, req)
    plan = bind(plan, m.tokenizer, prompt, thinking, _budget(state, req, thinking))
    params = reply_params(sampling_params(lambda: SamplingParams(**kw)), plan)
    handles = await submit(m, [prompt], params, "messages")
    return await respond(request, state, m, handles, req.stream,
                         lambda src: stream_events(src, m.name, plan, len(prompt), thinking),
                         lambda outs: body(m.name, Reply.of(outs[0], plan), thinking), NAMED_SSE_ANTHROPIC)


@router.post("/v1/messages/count_tokens")
async def count_tokens(req: CountTokensRequest, state: State) -> dict[str, int]:
    m = await state.model_for(req.model)
    return {"input_tokens": len(await _prompt(state, m, req, _plan(req, m.tokenizer.chat_template)))}
