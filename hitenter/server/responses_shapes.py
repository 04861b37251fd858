"""OpenAI Responses' response object and its event stream, built from a Reply.

Output items: one ``message`` (``output_text`` part) unless the reply is only tool calls, then one
``function_call`` per call. ``status`` is ``completed``, or ``incomplete`` with ``incomplete_details.reason
= "max_output_tokens"`` when the budget ran out. The stream follows the documented sequence, each event
with its ``sequence_number``: ``response.created``, ``response.in_progress``; for the message
``response.output_item.added``, ``response.content_part.added``, ``response.output_text.delta``...,
``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``; for each
call ``response.output_item.added``, ``response.function_call_arguments.delta`` / ``.done``,
``response.output_item.done``; then ``response.completed`` (or ``response.incomplete``) with the whole
response, whose items carry the same ids as the events did.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

from hitenter.outputs import PositionLogprobs
from hitenter.server.openai_shapes import chat_logprobs
from hitenter.server.reply import Done, Piece, Reply, reply_events
from hitenter.server.schema_types import new_id
from hitenter.server.streams import Source
from hitenter.server.tools import ToolPlan

# (status, output items, usage or None, reply or None) -> the response object
Base = Callable[[str, list[dict[str, Any]], dict[str, Any] | None, Reply | None], dict[str, Any]]
Logprobs = Callable[[list[PositionLogprobs]], list[dict[str, Any]]]


def usage(r: Reply) -> dict[str, Any]:
    return {"input_tokens": r.prompt_tokens, "input_tokens_details": {"cached_tokens": r.cached_tokens},
            "output_tokens": r.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": r.prompt_tokens + r.completion_tokens}


def logprobs_fn(token_bytes: Any, k: int | None) -> Logprobs:
    """The output_text ``logprobs`` of some positions (empty lists when they were not asked for)."""
    if k is None:
        return lambda _: []
    return lambda positions: chat_logprobs(positions, token_bytes, k)["content"] if positions else []


def text_part(text: str, lps: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": lps}


def message_item(item_id: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def call_item(call: dict[str, Any], item_id: str, status: str, arguments: str | None = None) -> dict[str, Any]:
    fn = call["function"]
    return {"type": "function_call", "id": item_id, "call_id": call["id"], "name": fn["name"],
            "arguments": fn["arguments"] if arguments is None else arguments, "status": status}


def status_of(r: Reply) -> str:
    return "incomplete" if r.truncated else "completed"


def output_items(r: Reply, lps: Logprobs) -> list[dict[str, Any]]:
    items = []
    if r.content or not r.calls:
        items.append(message_item(new_id("msg", "_"), "completed", [text_part(r.content, lps(r.logprobs or []))]))
    items += [call_item(c, new_id("fc", "_"), "completed") for c in r.calls]
    return items


class _Events:
    def __init__(self) -> None:
        self.seq = itertools.count()

    def __call__(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "sequence_number": next(self.seq), **fields}


async def stream_events(src: Source, plan: ToolPlan, base: Base, lps: Logprobs) -> AsyncIterator[dict[str, Any]]:
    """The documented event sequence of one response (see the module docstring)."""
    ev, msg_id = _Events(), new_id("msg", "_")
    yield ev("response.created", response=base("in_progress", [], None, None))
    yield ev("response.in_progress", response=base("in_progress", [], None, None))
    text, text_lps, opened = "", [], False

    def opening() -> list[dict[str, Any]]:
        return [ev("response.output_item.added", output_index=0, item=message_item(msg_id, "in_progress", [])),
                ev("response.content_part.added", item_id=msg_id, output_index=0, content_index=0,
                   part=text_part("", []))]

    async for e in reply_events(src, plan):
        if isinstance(e, Piece):
            if not e.text:
                continue
            if not opened:
                opened = True
                for x in opening():
                    yield x
            piece_lps = lps(e.logprobs)
            text, text_lps = text + e.text, text_lps + piece_lps
            yield ev("response.output_text.delta", item_id=msg_id, output_index=0, content_index=0, delta=e.text,
                     logprobs=piece_lps)
            continue
        assert isinstance(e, Done)
        r, items = e.reply, []
        if opened or not r.calls:
            if not opened:
                for x in opening():
                    yield x
            part = text_part(text, text_lps)
            yield ev("response.output_text.done", item_id=msg_id, output_index=0, content_index=0, text=text,
                     logprobs=text_lps)
            yield ev("response.content_part.done", item_id=msg_id, output_index=0, content_index=0, part=part)
            items.append(message_item(msg_id, "completed", [part]))
            yield ev("response.output_item.done", output_index=0, item=items[-1])
        for call in r.calls:
            i, item_id, args = len(items), new_id("fc", "_"), call["function"]["arguments"]
            yield ev("response.output_item.added", output_index=i, item=call_item(call, item_id, "in_progress", ""))
            yield ev("response.function_call_arguments.delta", item_id=item_id, output_index=i, delta=args)
            yield ev("response.function_call_arguments.done", item_id=item_id, output_index=i, arguments=args,
                     name=call["function"]["name"])
            items.append(call_item(call, item_id, "completed"))
            yield ev("response.output_item.done", output_index=i, item=items[-1])
        status = status_of(r)
        yield ev(f"response.{status}", response=base(status, items, usage(r), r))
