"""The one generation path every surface takes: queue a request's prompts on the model's EngineClient
(all or none), then answer with one JSON body or a stream in the surface's framing (framing.py).
Whatever way the answer ends, every engine request still running is aborted (its KV blocks freed).

A surface supplies two functions over the engine outputs: ``streamer`` (``(prompt index,
RequestOutput)``s -> its stream events) and ``build`` (the finished outputs -> its JSON body).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from hitenter.errors import ContextOverflowError, QueueFullError
from hitenter.outputs import RequestOutput
from hitenter.sampling_params import SamplingParams
from hitenter.server.api_error import APIError, SafeJSONResponse, overflow_error, param_of
from hitenter.server.engine_client import Handle
from hitenter.server.errors import internal_message
from hitenter.server.framing import OPENAI_SSE, Framing
from hitenter.server.schema_types import MAX_N
from hitenter.server.state import ServedModel, ServerState
from hitenter.server.streams import RequestStreams, Source, until_disconnected

log = logging.getLogger("hitenter.server")
Streamer = Callable[[Source], AsyncIterator[dict[str, Any]]]
Builder = Callable[[list[RequestOutput]], dict[str, Any]]


def sampling_params(make: Callable[[], SamplingParams], n_prompts: int = 1) -> SamplingParams:
    """``make()``'s SamplingParams; its ValueError (named field first) becomes a 400 naming that field."""
    try:
        params = make()
    except (ValueError, OverflowError, TypeError) as e:
        if isinstance(e, APIError):
            raise
        raise APIError(400, str(e), param_of(str(e))) from e
    if params.n * n_prompts > MAX_N:
        raise APIError(400, f"n: at most {MAX_N} completions per request (n x prompts)", "n")
    return params


async def submit(m: ServedModel, prompts: list[list[int]], params: SamplingParams, param: str) -> list[Handle]:
    """Queue every prompt or none: a failure aborts those already queued."""
    handles: list[Handle] = []
    try:
        for p in prompts:
            handles.append(await m.client.add(p, params))
    except BaseException as e:
        for rid, _ in handles:
            m.client.abort(rid)
        if isinstance(e, ContextOverflowError):
            raise overflow_error(param, e.n_prompt_tokens, e.n_ctx, e.max_tokens, str(e)) from e
        if isinstance(e, QueueFullError):
            raise APIError(429, str(e)) from e
        if isinstance(e, (ValueError, OverflowError)):
            raise APIError(400, str(e), param_of(str(e)) or param) from e
        raise
    return handles


class _EngineStream(StreamingResponse):
    """A stream that aborts its engine requests however it ends, even if its body never started."""

    def __init__(self, rs: RequestStreams, body: AsyncIterator[bytes], media_type: str) -> None:
        super().__init__(body, media_type=media_type, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.rs = rs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.rs.close()


async def _body(events: AsyncIterator[dict[str, Any]], framing: Framing) -> AsyncIterator[bytes]:
    try:
        async for ev in events:
            yield framing.event(ev)
    except Exception as e:           # mid-stream failure: an error event, then the end
        log.exception("stream failed")
        err = e if isinstance(e, APIError) else APIError(500, internal_message(e))
        yield framing.failure(err)
    finally:
        await events.aclose()       # type: ignore[attr-defined]
    if framing.end():
        yield framing.end()


async def _outputs(state: ServerState, m: ServedModel, rs: RequestStreams) -> Source:
    seen: set[int] = set()
    async for i, out in rs.outputs():
        state.metrics.on_output(m.name, out, i not in seen)
        seen.add(i)
        yield i, out


async def _collect(outputs: Source, n: int) -> list[RequestOutput]:
    final: dict[int, RequestOutput] = {}
    async for i, out in outputs:
        if out.finished:
            final[i] = out
    return [final[i] for i in range(n)]


async def respond(request: Request, state: ServerState, m: ServedModel, handles: list[Handle], stream: bool,
                  streamer: Streamer, build: Builder, framing: Framing = OPENAI_SSE) -> Response:
    """Answer ``handles``: a stream of ``streamer``'s events, or ``build``'s body once all finished
    (499, nothing sent, when the client left first)."""
    rs = RequestStreams(handles, m.client.abort, lambda: state.metrics.on_abort(m.name))
    if stream:
        return _EngineStream(rs, _body(streamer(_outputs(state, m, rs)), framing), framing.media_type)
    try:
        outs = await until_disconnected(request, _collect(_outputs(state, m, rs), len(handles)))
    except Exception as e:
        raise APIError(500, internal_message(e)) from e
    finally:
        rs.close()
    if outs is None:
        return Response(status_code=499)
    return SafeJSONResponse(build(outs))
