"""Response bodies: SSE framing, the output streams of one HTTP request, and OpenAI-shaped JSON.

``RequestStreams.outputs`` reads the queues that ``AsyncLLMEngine.add_request`` returned and yields
``(prompt_index, RequestOutput)`` as they arrive. However it ends (done, an engine error raised to the
caller, or the consumer closed/cancelled because the client went away), every engine request of it
that has not finished is aborted, which frees its KV blocks at once.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request

from hitenter.engine.async_engine import AsyncLLMEngine
from hitenter.outputs import PositionLogprobs, RequestOutput
from hitenter.sampling_params import SamplingParams
from hitenter.server.protocol import new_id, now

_LOGPROB_FLOOR = -9999.0      # JSON has no -inf; vLLM clamps the same way
Source = AsyncIterator[tuple[int, RequestOutput]]
TokenBytes = Callable[[int], bytes]
T = TypeVar("T")

DONE = "data: [DONE]\n\n"

Handle = tuple[str, "asyncio.Queue[RequestOutput | BaseException]"]


def sse(obj: Any) -> str:
    """One event: ``data: {json}`` and a blank line."""
    return "data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n\n"


class RequestStreams:
    """The engine requests of one HTTP request. ``outputs()`` merges their queues; ``close()`` aborts
    every one not finished yet (idempotent), and runs whenever ``outputs()`` ends, or from the
    response's own ``finally`` when the client left before ``outputs()`` ever started."""

    def __init__(self, handles: list[Handle], abort: Callable[[str], None],
                 on_abort: Callable[[], None] | None = None) -> None:
        self.handles, self.abort, self.on_abort = handles, abort, on_abort
        self.live = set(range(len(handles)))

    def close(self) -> None:
        for i in sorted(self.live):
            self.abort(self.handles[i][0])
            if self.on_abort is not None:
                self.on_abort()
        self.live.clear()

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        live, handles = self.live, self.handles
        pending: dict[asyncio.Future[Any], int] = {}
        try:
            while live:
                if len(live) == 1 and not pending:        # the common case: no helper tasks
                    i = next(iter(live))
                    ready = [(i, await handles[i][1].get())]
                else:
                    for i in live - set(pending.values()):
                        pending[asyncio.ensure_future(handles[i][1].get())] = i
                    done, _ = await asyncio.wait(list(pending), return_when=asyncio.FIRST_COMPLETED)
                    ready = sorted(((pending.pop(t), t.result()) for t in done), key=lambda x: x[0])
                for i, item in ready:
                    if isinstance(item, BaseException):
                        raise item
                    if item.finished:
                        live.discard(i)
                    yield i, item
        finally:
            for t in pending:
                t.cancel()
            self.close()


# ---- engine calls off the event loop, and client disconnects -----------------------------------

async def add_request(engine: AsyncLLMEngine, prompt: list[int], params: SamplingParams) -> Handle:
    """``engine.add_request`` off the event loop (its lock is held for a whole engine step, which
    would otherwise stall every other stream of this server)."""
    loop = asyncio.get_running_loop()
    fut = asyncio.ensure_future(asyncio.to_thread(engine.add_request, prompt, params, None, loop=loop))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:      # the caller went away mid-add: abort what got added
        fut.add_done_callback(lambda f: None if f.cancelled() or f.exception() else engine.abort(f.result()[0]))
        raise


def abort_soon(engine: AsyncLLMEngine) -> Callable[[str], None]:
    """An abort that does not block the event loop on the engine lock (it runs in a worker thread)."""

    def abort(request_id: str) -> None:
        try:
            asyncio.get_running_loop().run_in_executor(None, engine.abort, request_id)
        except RuntimeError:            # no loop (closing): abort here
            engine.abort(request_id)
    return abort


async def wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """Run work; if the client goes away first, cancel it (its streams abort their requests) -> None."""
    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait([task, watch], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return None
    finally:
        watch.cancel()


# ---- OpenAI shapes ---------------------------------------------------------------------------

def _lp(x: float) -> float:
    return x if math.isfinite(x) else _LOGPROB_FLOOR


def completion_logprobs(positions: list[PositionLogprobs], offset: int) -> dict[str, Any]:
    """Legacy completions shape; ``offset`` is the text length before the first of these tokens."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for pos in positions:
        tokens.append(pos.chosen.token)
        token_lps.append(_lp(pos.chosen.logprob))
        top = {t.token: _lp(t.logprob) for t in pos.top}
        top.setdefault(pos.chosen.token, _lp(pos.chosen.logprob))
        tops.append(top)
        offsets.append(offset)
        offset += len(pos.chosen.token)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(positions: list[PositionLogprobs], token_bytes: Any, k: int) -> dict[str, Any]:
    def entry(token_id: int, token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": _lp(logprob), "bytes": list(token_bytes(token_id))}

    content = []
    for pos in positions:
        e = entry(pos.chosen.token_id, pos.chosen.token, pos.chosen.logprob)
        e["top_logprobs"] = [entry(t.token_id, t.token, t.logprob) for t in pos.top[:k]]
        content.append(e)
    return {"content": content}


def usage(outs: list[RequestOutput]) -> dict[str, Any]:
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    completion = sum(len(c.token_ids) for o in outs for c in o.outputs)
    cached = sum(o.num_cached_tokens for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


class UsageSoFar:
    """Token counts as a stream goes (``stream_options.continuous_usage_stats``): every output seen."""

    def __init__(self, prompt_tokens: dict[int, int] | None = None) -> None:
        self.prompt: dict[int, int] = dict(prompt_tokens or {})
        self.completion = 0

    def add(self, i: int, out: RequestOutput) -> None:
        self.prompt.setdefault(i, len(out.prompt_token_ids))
        self.completion += sum(len(c.delta_token_ids) for c in out.outputs)

    def usage(self) -> dict[str, int]:
        p = sum(self.prompt.values())
        return {"prompt_tokens": p, "completion_tokens": self.completion, "total_tokens": p + self.completion}


def finish_fields(finish_reason: str | None, stop_reason: int | str | None) -> dict[str, Any]:
    fr = finish_reason if finish_reason in (None, "stop", "length") else "stop"
    return {"finish_reason": fr, "stop_reason": stop_reason if fr is not None else None}


def _tok_len(positions: list[PositionLogprobs] | None) -> int:
    return sum(len(p.chosen.token) for p in positions or [])


def build_completion(outs: list[RequestOutput], model: str, n: int, echo: list[str]) -> dict[str, Any]:
    choices = []
    for i, out in enumerate(outs):
        for c in out.outputs:
            lps = None if c.logprobs is None else completion_logprobs(c.logprobs, len(echo[i]))
            choices.append({"index": i * n + c.index, "text": echo[i] + c.text, "logprobs": lps,
                            **finish_fields(c.finish_reason, c.stop_reason)})
    return {"id": new_id("cmpl"), "object": "text_completion", "created": now(), "model": model,
            "choices": choices, "usage": usage(outs)}


def build_chat(outs: list[RequestOutput], model: str, k: int, token_bytes: TokenBytes) -> dict[str, Any]:
    choices = []
    for c in outs[0].outputs:
        lps = None if c.logprobs is None else chat_logprobs(c.logprobs, token_bytes, k)
        choices.append({"index": c.index, "message": {"role": "assistant", "content": c.text}, "logprobs": lps,
                        **finish_fields(c.finish_reason, c.stop_reason)})
    return {"id": new_id("chatcmpl"), "object": "chat.completion", "created": now(), "model": model,
            "choices": choices, "usage": usage(outs)}


async def stream_completion(src: Source, model: str, n: int, echo: list[str], include_usage: bool,
                            continuous: bool = False) -> AsyncIterator[dict[str, Any]]:
    """Completion chunks; ``continuous``: each carries the usage so far (vLLM's continuous_usage_stats)."""
    head = {"id": new_id("cmpl"), "object": "text_completion", "created": now(), "model": model}
    tok_offset: dict[int, int] = {}
    done: set[int] = set()
    finals: dict[int, RequestOutput] = {}
    so_far = UsageSoFar()
    async for i, out in src:
        so_far.add(i, out)
        if out.finished:
            finals[i] = out
        for c in out.outputs:
            idx = i * n + c.index
            if idx in done:
                continue
            text = c.delta_text
            if idx not in tok_offset:
                tok_offset[idx] = len(echo[i])
                text = echo[i] + text
            lps = None
            if c.delta_logprobs:
                lps = completion_logprobs(c.delta_logprobs, tok_offset[idx])
                tok_offset[idx] += _tok_len(c.delta_logprobs)
            if not (text or lps or c.finish_reason):
                continue
            if c.finish_reason:
                done.add(idx)
            chunk = {**head, "choices": [{"index": idx, "text": text, "logprobs": lps,
                                          **finish_fields(c.finish_reason, c.stop_reason)}]}
            yield {**chunk, "usage": so_far.usage()} if continuous else chunk
    if include_usage:
        yield {**head, "choices": [], "usage": usage([finals[i] for i in sorted(finals)])}


async def stream_chat(src: Source, model: str, n: int, k: int, token_bytes: TokenBytes, include_usage: bool,
                      continuous: bool = False, prompt_tokens: int = 0) -> AsyncIterator[dict[str, Any]]:
    """Chat chunks: a role chunk per choice, content deltas, finish; ``continuous`` as in stream_completion
    (``prompt_tokens``: the prompt's length, for the role chunks' usage)."""
    head = {"id": new_id("chatcmpl"), "object": "chat.completion.chunk", "created": now(), "model": model}
    so_far = UsageSoFar({0: prompt_tokens})
    extra: Callable[[], dict[str, Any]] = (lambda: {"usage": so_far.usage()}) if continuous else dict
    for idx in range(n):
        yield {**head, "choices": [{"index": idx, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}], **extra()}
    done: set[int] = set()
    final: list[RequestOutput] = []
    async for _, out in src:
        so_far.add(0, out)
        if out.finished:
            final = [out]
        for c in out.outputs:
            if c.index in done:
                continue
            lps = chat_logprobs(c.delta_logprobs, token_bytes, k) if c.delta_logprobs else None
            if not (c.delta_text or lps or c.finish_reason):
                continue
            if c.finish_reason:
                done.add(c.index)
            delta = {"content": c.delta_text} if c.delta_text else {}
            yield {**head, "choices": [{"index": c.index, "delta": delta, "logprobs": lps,
                                        **finish_fields(c.finish_reason, c.stop_reason)}], **extra()}
    if include_usage:
        yield {**head, "choices": [], "usage": usage(final)}
