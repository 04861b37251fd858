"""Running a request on the engine for a route: queue its prompts (all or none), then answer with
one JSON body or a server-sent event stream. Whatever way the answer ends, every engine request
still running is aborted (its KV blocks freed at once)."""

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
from hitenter.server import protocol as P
from hitenter.server.errors import internal_message
from hitenter.server.sse import DONE, Handle, RequestStreams, abort_soon, add_request, sse, until_disconnected
from hitenter.server.state import ServedModel, ServerState

log = logging.getLogger("hitenter.server")
Streamer = Callable[[AsyncIterator[tuple[int, RequestOutput]]], AsyncIterator[dict[str, Any]]]
Builder = Callable[[list[RequestOutput]], dict[str, Any]]


def params_of(req: P.CompletionRequest | P.ChatCompletionRequest, n_prompts: int) -> SamplingParams:
    try:
        params = req.to_sampling_params()
    except (ValueError, OverflowError, TypeError) as e:
        raise P.APIError(400, str(e), P.param_of(str(e))) from e
    if params.n * n_prompts > P.MAX_N:
        raise P.APIError(400, f"n: at most {P.MAX_N} completions per request (n x prompts)", "n")
    return params


async def submit(m: ServedModel, prompts: list[list[int]], params: SamplingParams, param: str) -> list[Handle]:
    """Queue every prompt or none: a failure aborts those already queued."""
    handles: list[Handle] = []
    try:
        for p in prompts:
            handles.append(await add_request(m.engine, p, params))
    except BaseException as e:
        for rid, _ in handles:
            abort_soon(m.engine)(rid)
        if isinstance(e, ContextOverflowError):
            raise P.overflow_error(param, e.n_prompt_tokens, e.n_ctx, e.max_tokens, str(e)) from e
        if isinstance(e, QueueFullError):
            raise P.APIError(429, str(e)) from e
        if isinstance(e, (ValueError, OverflowError)):
            raise P.APIError(400, str(e), P.param_of(str(e)) or param) from e
        raise
    return handles


class _EngineStream(StreamingResponse):
    """SSE response that aborts its engine requests however it ends, even if its body never started."""

    def __init__(self, rs: RequestStreams, body: AsyncIterator[bytes]) -> None:
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.rs = rs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.rs.close()


async def _sse_body(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    try:
        async for c in chunks:
            yield sse(c).encode("utf-8", "replace")
    except Exception as e:           # mid-stream failure: an error event, then [DONE]
        log.exception("stream failed")
        yield sse(P.APIError(500, internal_message(e)).body()).encode("utf-8", "replace")
    finally:
        await chunks.aclose()       # type: ignore[attr-defined]
    yield DONE.encode()


async def _outputs(state: ServerState, m: ServedModel,
                   rs: RequestStreams) -> AsyncIterator[tuple[int, RequestOutput]]:
    seen: set[int] = set()
    async for i, out in rs.outputs():
        state.metrics.on_output(m.name, out, i not in seen)
        seen.add(i)
        yield i, out


async def _collect(outputs: AsyncIterator[tuple[int, RequestOutput]], n: int) -> list[RequestOutput]:
    final: dict[int, RequestOutput] = {}
    async for i, out in outputs:
        if out.finished:
            final[i] = out
    return [final[i] for i in range(n)]


async def respond(request: Request, state: ServerState, m: ServedModel, handles: list[Handle], stream: bool,
                  streamer: Streamer, build: Builder) -> Response:
    rs = RequestStreams(handles, abort_soon(m.engine), lambda: state.metrics.on_abort(m.name))
    if stream:
        return _EngineStream(rs, _sse_body(streamer(_outputs(state, m, rs))))
    try:
        outs = await until_disconnected(request, _collect(_outputs(state, m, rs), len(handles)))
    except Exception as e:
        raise P.APIError(500, internal_message(e)) from e
    finally:
        rs.close()
    if outs is None:
        return Response(status_code=499)
    return P.SafeJSONResponse(build(outs))
