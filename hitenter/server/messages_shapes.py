"""Anthropic Messages' response body and event stream, built from a Reply.

Content: a ``text`` block (unless the reply is only tool calls), then a ``tool_use`` block per call
(``input`` an object, id ``toolu_...``). ``stop_reason``: ``tool_use`` when it called, ``max_tokens`` when
the budget ran out, ``stop_sequence`` (with ``stop_sequence`` set) when one matched, else ``end_turn``.
The stream is the documented sequence: ``message_start``, ``ping``, per block ``content_block_start``,
``content_block_delta``s (``text_delta``, or one ``input_json_delta`` with the whole input),
``content_block_stop``, then ``message_delta`` (stop reason, output tokens) and ``message_stop``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from hitenter.server.reply import Done, Piece, Reply, reply_events
from hitenter.server.schema_types import new_id
from hitenter.server.streams import Source
from hitenter.server.tools import ToolPlan, call_arguments


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


def content(r: Reply) -> list[dict[str, Any]]:
    blocks = [{"type": "text", "text": r.content}] if r.content or not r.calls else []
    return blocks + [tool_use(c) for c in r.calls]


def message(msg_id: str, model: str, blocks: list[dict[str, Any]], stop: dict[str, Any],
            used: dict[str, Any]) -> dict[str, Any]:
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": blocks, **stop,
            "usage": used}


def body(model: str, r: Reply) -> dict[str, Any]:
    return message(new_id("msg", "_"), model, content(r), stop_fields(r), usage(r))


async def stream_events(src: Source, model: str, plan: ToolPlan, prompt_tokens: int) -> AsyncIterator[dict[str, Any]]:
    """The documented event sequence of one message (see the module docstring)."""
    start = message(new_id("msg", "_"), model, [], {"stop_reason": None, "stop_sequence": None}, usage(None, prompt_tokens))
    yield {"type": "message_start", "message": start}
    yield {"type": "ping"}
    opened = False
    async for e in reply_events(src, plan):
        if isinstance(e, Piece):
            if not e.text:
                continue
            if not opened:
                opened = True
                yield {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
            yield {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": e.text}}
            continue
        assert isinstance(e, Done)
        r, index = e.reply, 0
        if opened or not r.calls:
            if not opened:
                yield {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
            yield {"type": "content_block_stop", "index": 0}
            index = 1
        for call in r.calls:
            block = tool_use(call)
            yield {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}}
            yield {"type": "content_block_delta", "index": index,
                   "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}}
            yield {"type": "content_block_stop", "index": index}
            index += 1
        yield {"type": "message_delta", "delta": stop_fields(r), "usage": {"output_tokens": r.completion_tokens}}
        yield {"type": "message_stop"}
