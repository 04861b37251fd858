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

The request bodies are in protocol_anthropic.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

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
from hitenter.server.protocol_anthropic import CountTokensRequest, MessagesRequest
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


# Anthropic's field -> SamplingParams' (a field left out keeps SamplingParams' default, except DEFAULTS)
SAMPLING = {"max_tokens": "max_tokens", "stop_sequences": "stop", "temperature": "temperature", "top_p": "top_p",
            "top_k": "top_k"}
DEFAULTS = {"temperature": 1.0}          # Anthropic's documented default


def sampling_kwargs(req: MessagesRequest) -> dict[str, Any]:
    """The request's sampling fields as SamplingParams' keywords (SAMPLING), validated once by
    SamplingParams (generation.sampling_params turns its ValueError into a 400 naming the field)."""
    got = {ours: getattr(req, theirs) for theirs, ours in SAMPLING.items() if getattr(req, theirs) is not None}
    return {**DEFAULTS, **got}


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
    thinking = thinking_on(m, req)
    plan = bind(plan, m.tokenizer, prompt, thinking, _budget(state, req, thinking))
    params = reply_params(sampling_params(lambda: SamplingParams(**sampling_kwargs(req), structured=spec)), plan)
    handles = await submit(m, [prompt], params, "messages")
    return await respond(request, state, m, handles, req.stream,
                         lambda src: stream_events(src, m.name, plan, len(prompt), thinking),
                         lambda outs: body(m.name, Reply.of(outs[0], plan), thinking), NAMED_SSE_ANTHROPIC)


@router.post("/v1/messages/count_tokens")
async def count_tokens(req: CountTokensRequest, state: State) -> dict[str, int]:
    m = await state.model_for(req.model)
    return {"input_tokens": len(await _prompt(state, m, req, _plan(req, m.tokenizer.chat_template)))}
