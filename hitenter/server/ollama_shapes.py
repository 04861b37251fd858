"""Ollama's response bodies and NDJSON streams for /api/chat and /api/generate, built from a Reply.

Every final object carries Ollama's statistics in nanoseconds: ``total_duration`` (the HTTP request's
start to now), ``load_duration`` (its start to the engine's arrival: templating and tokenizing; models
are loaded when the server starts), ``prompt_eval_count`` / ``prompt_eval_duration`` (the prompt's
tokens, arrival to the first generated token), ``eval_count`` / ``eval_duration`` (generated tokens,
first to last). Tool calls are ``{"function": {"name", "arguments": {...}}}`` (arguments an object).
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from hitenter.outputs import PositionLogprobs
from hitenter.server.reply import Done, Piece, Reply, reply_events
from hitenter.server.streams import Source
from hitenter.server.tools import ToolPlan, call_arguments

NS = 1_000_000_000


def created_at() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _ns(seconds: float | None) -> int:
    return max(0, int((seconds or 0.0) * NS))


def stats(reply: Reply, t0: float) -> dict[str, Any]:
    """Ollama's counts and durations of a finished reply; ``t0``: time.monotonic() at the request's start."""
    m = reply.metrics
    arrival = m.arrival_time if m is not None else t0
    first = arrival + (m.time_to_first_token or 0.0) if m is not None else t0
    last = (m.finished_time or time.monotonic()) if m is not None else time.monotonic()
    return {"total_duration": _ns(time.monotonic() - t0), "load_duration": _ns(arrival - t0),
            "prompt_eval_count": reply.prompt_tokens, "prompt_eval_duration": _ns(first - arrival),
            "eval_count": reply.completion_tokens, "eval_duration": _ns(last - first)}


def tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": c["id"], "function": {"index": i, "name": c["function"]["name"], "arguments": call_arguments(c)}}
            for i, c in enumerate(calls)]


def logprobs(positions: list[PositionLogprobs], token_bytes: Any) -> list[dict[str, Any]]:
    def one(tid: int, tok: str, lp: float) -> dict[str, Any]:
        return {"token": tok, "logprob": lp if math.isfinite(lp) else -9999.0, "bytes": list(token_bytes(tid))}
    return [{**one(p.chosen.token_id, p.chosen.token, p.chosen.logprob),
             "top_logprobs": [one(t.token_id, t.token, t.logprob) for t in p.top]} for p in positions]


def _head(model: str) -> dict[str, Any]:
    return {"model": model, "created_at": created_at()}


def _done_fields(reply: Reply, t0: float) -> dict[str, Any]:
    return {"done": True, "done_reason": "length" if reply.truncated else "stop", **stats(reply, t0)}


def chat_message(reply: Reply) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.calls:
        msg["tool_calls"] = tool_calls(reply.calls)
    return msg


def chat_body(model: str, reply: Reply, t0: float, token_bytes: Any = None) -> dict[str, Any]:
    body = {**_head(model), "message": chat_message(reply), **_done_fields(reply, t0)}
    if token_bytes is not None:
        body["logprobs"] = logprobs(reply.logprobs or [], token_bytes)
    return body


def generate_body(model: str, reply: Reply, t0: float, token_bytes: Any = None) -> dict[str, Any]:
    body = {**_head(model), "response": reply.content, **_done_fields(reply, t0),
            "context": reply.prompt_token_ids + reply.token_ids}
    if token_bytes is not None:
        body["logprobs"] = logprobs(reply.logprobs or [], token_bytes)
    return body


async def chat_stream(src: Source, model: str, plan: ToolPlan, t0: float,
                      token_bytes: Any = None) -> AsyncIterator[dict[str, Any]]:
    """One object per text piece (``message.content`` a delta), the tool calls in one object, then the
    final one (``done``, statistics) with empty content."""
    async for ev in reply_events(src, plan):
        if isinstance(ev, Piece):
            chunk = {**_head(model), "message": {"role": "assistant", "content": ev.text}, "done": False}
            if token_bytes is not None:
                chunk["logprobs"] = logprobs(ev.logprobs, token_bytes)
            yield chunk
            continue
        assert isinstance(ev, Done)
        if ev.reply.calls:
            yield {**_head(model), "message": {"role": "assistant", "content": "",
                                               "tool_calls": tool_calls(ev.reply.calls)}, "done": False}
        yield {**_head(model), "message": {"role": "assistant", "content": ""}, **_done_fields(ev.reply, t0)}


async def generate_stream(src: Source, model: str, plan: ToolPlan, t0: float,
                          token_bytes: Any = None) -> AsyncIterator[dict[str, Any]]:
    """One object per text piece (``response`` a delta), then the final one with ``context``."""
    async for ev in reply_events(src, plan):
        if isinstance(ev, Piece):
            chunk = {**_head(model), "response": ev.text, "done": False}
            if token_bytes is not None:
                chunk["logprobs"] = logprobs(ev.logprobs, token_bytes)
            yield chunk
            continue
        assert isinstance(ev, Done)
        r = ev.reply
        yield {**_head(model), "response": "", **_done_fields(r, t0), "context": r.prompt_token_ids + r.token_ids}
