"""The one generation path every surface takes, and what the routes share.

- The server's options and ``State`` (a route's dependency): ``await state.model_for(name)`` is the model a
  request names, loaded on demand and held until its response is sent (model_manager.py).
- Prompts to token ids, with the checks that run before any tokenizing. The character bound: a
  byte-level BPE token decodes to at most ``max_token_bytes`` bytes and a character is at least one
  UTF-8 byte, so a text of ``c`` characters needs at least ``c / max_token_bytes`` tokens; a prompt
  longer than ``max_token_bytes * max_model_len`` characters cannot fit the window and is refused at
  once (400), never a heuristic: every prompt it refuses would overflow after tokenizing too.
- ``submit``: queue a request's prompts on the model's client (all or none); ``respond``: one JSON body
  (``build`` over the finished outputs) or a stream (``streamer`` over ``(prompt index, RequestOutput)``
  pairs) in the surface's framing (OpenAI SSE, named SSE, NDJSON). Whatever way the answer ends, every
  engine request still running is aborted (its KV blocks freed); the metrics count what streamed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from hitenter.errors import ContextOverflowError, QueueFullError
from hitenter.models.vision.content import image_parts
from hitenter.outputs import RequestOutput
from hitenter.sampling_params import SamplingParams
from hitenter.server.api_error import APIError, SafeJSONResponse, internal_message, overflow_error, param_of
from hitenter.server.engine_client import Handle
from hitenter.server.image_chat import image_chat_ids
from hitenter.server.metrics import ServerMetrics
from hitenter.server.model_manager import DEFAULT, ModelManager, UnknownModel
from hitenter.server.schema_types import MAX_N
from hitenter.server.served_model import ServedModel


def new_id(prefix: str, sep: str = "-") -> str:
    return f"{prefix}{sep}{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


Puller = Callable[[str, Callable[[str], None]], Any]     # (name, progress line callback) -> its path


@dataclass
class ServerState:
    manager: ModelManager                  # the resident models and what else can be loaded by name
    metrics: ServerMetrics
    special_in_content: bool = False       # --allow-special-tokens-in-content
    stores: dict[str, Any] = field(default_factory=dict)   # per-surface state (the Responses store)
    pull: Puller | None = None             # fetches a known model into the cache (None: the registry's pull)
    default_name: str = ""                 # the model a request that names none gets (the first started)
    reasoning_budget: int = -1             # --reasoning-budget: thinking tokens per reply (-1: unbounded)

    @property
    def models(self) -> dict[str, ServedModel]:
        """The resident models by name (a snapshot: models load and unload while the server runs)."""
        return self.manager.models

    @property
    def default(self) -> ServedModel:
        """The first model the server started with (it stays loaded)."""
        return self.manager.models[self.default_name]

    def roles(self) -> list[str]:
        """Chat roles every served model accepts ('tool' only where the chat template knows it)."""
        tool = all(supports_tool(m) for m in self.models.values())
        return ["system", "user", "assistant"] + (["tool"] if tool else [])

    def servable(self) -> list[str]:
        """Names a request may give: resident models, then those the server can load on demand."""
        return self.manager.servable()

    async def model_for(self, name: str | None, keep_alive: object = DEFAULT) -> ServedModel:
        """The model a request names (the default one when it names none), loaded if need be and held
        for the request until its response is sent (hitenter/server/model_manager.py)."""
        try:
            return await self.manager.acquire(name or self.default_name, keep_alive)
        except UnknownModel:
            raise APIError(404, f"the model `{name}` does not exist; served: {self.servable()}", "model") from None


def server_state(request: Request) -> ServerState:
    return request.app.state.server   # type: ignore[no-any-return]


State = Annotated[ServerState, Depends(server_state)]


def check_chars(m: ServedModel, n_chars: int, param: str) -> None:
    """A text too long for the window whatever it says: OpenAI's overflow wording (clients search for
    "maximum context length"), ``n_prompt_tokens`` the least number of tokens it can take."""
    bound = m.max_prompt_chars
    if bound is not None and n_chars > bound:
        at_least = -(-n_chars * m.max_model_len // bound)          # ceil(chars / longest token's bytes)
        raise overflow_error(param, at_least, m.max_model_len, detail=f"{n_chars} characters need at least "
                             f"{at_least} tokens: at most {bound} characters fit the window of `{m.name}`")


def check_ids(m: ServedModel, ids: list[int], param: str) -> None:
    """Token ids inside the vocabulary and the window (before any model work sees them)."""
    if len(ids) > m.max_model_len:
        raise overflow_error(param, len(ids), m.max_model_len)
    vocab = m.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise APIError(400, f"{param}: token ids must be in 0..{vocab - 1}, got {bad[:5]}", param)


async def encode(m: ServedModel, prompt: str | list[int], param: str, add_bos: bool | None = None) -> list[int]:
    """Token ids of a prompt (ids pass through, checked against the vocabulary and the window);
    ``add_bos``: the GGUF's choice when None (lm-eval's remote tokenizer asks for none)."""
    if not isinstance(prompt, str):
        check_ids(m, prompt, param)
        return prompt
    check_chars(m, len(prompt), param)
    try:
        return await asyncio.to_thread(m.tokenizer.encode, prompt, add_bos)
    except Exception as e:
        raise APIError(400, f"{param}: could not be tokenized: {e}", param) from e


def supports_tool(m: ServedModel) -> bool:
    return "tool" in (getattr(m.tokenizer, "chat_template", None) or "")


def _role_problem(m: ServedModel, messages: list[dict[str, Any]], param: str) -> APIError | None:
    for i, msg in enumerate(messages):
        if msg["role"] == "tool" and not supports_tool(m):
            return APIError(400, f"{param}.{i}.role: this model's chat template has no 'tool' role",
                            f"{param}.{i}.role")
    return None


async def chat_ids(state: ServerState, m: ServedModel, messages: list[dict[str, Any]],
                   add_generation_prompt: bool, continue_final: bool = False, param: str = "messages",
                   **template_kw: Any) -> list[int]:
    """Token ids of a conversation: message content stays text (see Tokenizer.apply_chat_template).
    ``continue_final``: cut right after the final (assistant) message's content, so the model continues
    it (the template's closing markup after it is dropped); ``template_kw``: e.g. ``tools``."""
    if m.client.info.encoder:     # before the template: an encoder file has none, and generates nothing
        raise APIError(400, f"model: {m.name} is an embedding model ({m.client.info.architecture}); it does not "
                       "generate text: use /v1/embeddings (or /v1/rerank for a reranker)", "model")
    check_chars(m, sum(_chars(x.get("content")) for x in messages), param)
    problem = _role_problem(m, messages, param)
    if problem is not None:
        raise problem
    if image_parts(messages):   # images: an ImagePrompt (hitenter/server/image_chat.py)
        if continue_final:
            raise APIError(400, "continue_final_message: not supported with images", "continue_final_message")
        return await image_chat_ids(m, messages, add_generation_prompt, state.special_in_content, param,
                                    **template_kw)
    try:
        ids = await asyncio.to_thread(m.tokenizer.apply_chat_template, messages,
                                      add_generation_prompt=add_generation_prompt, tokenize=True,
                                      special_in_content=state.special_in_content, **template_kw)
        if continue_final:
            text = m.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                   **template_kw)
            ids = _cut_after_final(m, list(ids), str(text), messages)
    except APIError:
        raise
    except Exception as e:   # a template that rejects the conversation (roles, order) is the caller's error
        raise APIError(400, f"{param}: the chat template rejected them: {e}", param) from e
    return list(ids)


def _chars(content: Any) -> int:
    """Characters of a message's text (a content list: its text parts')."""
    if isinstance(content, list):
        return sum(len(str(p.get("text") or "")) for p in content if isinstance(p, dict))
    return len(content or "")


def _cut_after_final(m: ServedModel, ids: list[int], text: str, messages: list[dict[str, Any]]) -> list[int]:
    """``ids`` without the template markup that follows the final message's content (prefill)."""
    final = (messages[-1].get("content") or "").strip()
    at = text.rfind(final) if final else -1
    if at < 0:
        raise APIError(400, "continue_final_message: the chat template changed the final message's text",
                       "continue_final_message")
    tail = m.tokenizer.encode(text[at + len(final):], add_bos=False)   # the template's own markup
    if tail and ids[-len(tail):] != tail:
        raise APIError(400, "continue_final_message: cannot cut this template's markup after the final "
                       "message", "continue_final_message")
    return ids[:len(ids) - len(tail)] if tail else ids


T = TypeVar("T")


Source = AsyncIterator[tuple[int, RequestOutput]]


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

    async def outputs(self) -> Source:
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


def _json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse(obj: Any) -> str:
    """One unnamed server-sent event: ``data: {json}`` and a blank line."""
    return "data: " + _json(obj) + "\n\n"


DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class Framing:
    media_type: str
    dialect: str            # whose error shape a failure takes (api_error.APIError.body)
    named: bool = False     # SSE with ``event:`` lines
    ndjson: bool = False
    done: str = ""          # the end marker

    def event(self, obj: dict[str, Any]) -> bytes:
        if self.ndjson:
            return (_json(obj) + "\n").encode("utf-8", "replace")
        if self.named:
            return f"event: {obj.get('type', 'message')}\ndata: {_json(obj)}\n\n".encode("utf-8", "replace")
        return sse(obj).encode("utf-8", "replace")

    def failure(self, err: APIError) -> bytes:
        body = err.body(self.dialect)
        if self.dialect == "openai" and self.named:          # Responses: {"type": "error", code, message}
            body = {"type": "error", "code": str(err.status), "message": err.message, "param": err.param}
        return self.event(body)

    def end(self) -> bytes:
        return self.done.encode()


OPENAI_SSE = Framing("text/event-stream", "openai", done=DONE)


NAMED_SSE_OPENAI = Framing("text/event-stream", "openai", named=True)


NAMED_SSE_ANTHROPIC = Framing("text/event-stream", "anthropic", named=True)


NDJSON = Framing("application/x-ndjson", "ollama", ndjson=True)


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
        count_output(state.metrics, m.name, out, i not in seen)
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
    rs = RequestStreams(handles, m.client.abort, lambda: state.metrics.aborted.labels(m.name).inc())
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


def count_output(metrics: ServerMetrics, m: str, out: RequestOutput, first: bool) -> None:
    """Every output a request streams, into the server's metrics (metrics.py); ``first``: its first one."""
    if first:
        metrics.prompt_tokens.labels(m).inc(len(out.prompt_token_ids))
        metrics.cached_tokens.labels(m).inc(out.num_cached_tokens)
    n = sum(len(c.delta_token_ids) for c in out.outputs)
    if n:
        metrics.generation_tokens.labels(m).inc(n)
    if not out.finished:
        return
    metrics.success.labels(m, out.outputs[0].finish_reason or "stop").inc()
    s = out.metrics
    if s is None:
        return
    if s.time_to_first_token is not None:
        metrics.ttft.labels(m).observe(s.time_to_first_token)
    if s.queue_time is not None:
        metrics.queue.labels(m).observe(s.queue_time)
    if s.finished_time is not None:
        metrics.e2e.labels(m).observe(max(s.finished_time - s.arrival_time, 0.0))
    for d in s.inter_token_latencies:
        metrics.itl.labels(m).observe(d)
    if s.num_preemptions:
        metrics.preemptions.labels(m).inc(s.num_preemptions)
