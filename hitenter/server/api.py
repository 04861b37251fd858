"""OpenAI-compatible HTTP server (FastAPI) on AsyncLLMEngine: /v1/completions, /v1/chat/completions,
/v1/models, /tokenize, /detokenize, /health, /metrics. Errors use vLLM's body shape (see protocol.APIError)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from hitenter.engine.async_engine import AsyncLLMEngine, EngineDeadError
from hitenter.engine.llm_engine import LLMEngine
from hitenter.errors import ContextOverflowError, QueueFullError
from hitenter.outputs import RequestOutput
from hitenter.sampling_params import SamplingParams
from hitenter.server import openai_compat as X
from hitenter.server import protocol as P
from hitenter.server.extra_routes import include_extra_routes, include_fallbacks
from hitenter.server.metrics import CONTENT_TYPE, ServerMetrics
from hitenter.server.sse import (
    DONE,
    Handle,
    RequestStreams,
    abort_soon,
    add_request,
    build_chat,
    build_completion,
    sse,
    stream_chat,
    stream_completion,
    until_disconnected,
)

log = logging.getLogger("hitenter.server")
MAX_N = 128          # most completions one request may ask for (n x prompts)


@dataclass
class ServedModel:
    name: str
    engine: AsyncLLMEngine
    owned: bool                      # created here: shut down with the app
    created: int = field(default_factory=P.now)

    @property
    def tokenizer(self) -> Any:
        return self.engine.engine.tokenizer


class _ApiKeyMiddleware:
    """Pure ASGI (BaseHTTPMiddleware would get in the way of streaming and disconnects)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app, self.key = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            auth = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(auth, self.key):
                err = P.APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'")
                await _error(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)


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


def _error(e: P.APIError) -> JSONResponse:
    return P.SafeJSONResponse(e.body(), status_code=e.status)


def create_app(engine: LLMEngine | AsyncLLMEngine, served_model_name: str | None = None, api_key: str | None = None,
               max_queued_requests: int | None = None,
               extra_engines: dict[str, LLMEngine | AsyncLLMEngine] | None = None, playground: bool = True) -> FastAPI:
    """The app. An LLMEngine is wrapped in an AsyncLLMEngine the app owns (and shuts down with it);
    ``max_queued_requests``, when given, is set on every engine. ``playground`` mounts the web
    playground (its API under /playground/api, the page at /) when it is installed."""

    def served(name: str | None, e: LLMEngine | AsyncLLMEngine) -> ServedModel:
        ae = e if isinstance(e, AsyncLLMEngine) else AsyncLLMEngine(e, max_queued_requests)
        if max_queued_requests is not None:
            ae.max_queued_requests = max_queued_requests
        return ServedModel(name or Path(ae.engine.parts.model_path).stem, ae, ae is not e)

    first = served(served_model_name, engine)
    models = {first.name: first}
    for name, e in (extra_engines or {}).items():
        models[name] = served(name, e)
    metrics = ServerMetrics(list(models))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        for m in models.values():
            if m.owned:
                await asyncio.to_thread(m.engine.shutdown)

    app = FastAPI(title="hitenter", version="0.1.0", lifespan=lifespan, default_response_class=P.SafeJSONResponse)
    app.state.models, app.state.metrics = models, metrics
    if api_key:
        app.add_middleware(_ApiKeyMiddleware, api_key=api_key)

    @app.exception_handler(P.APIError)
    async def _api_error(_: Request, exc: P.APIError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(P.validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(P.APIError(exc.status_code, str(exc.detail)))

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        return _error(P.APIError(500, _internal_message(exc)))

    def model_for(name: str | None) -> ServedModel:
        if not name:
            return first
        if name not in models:
            raise P.APIError(404, f"the model `{name}` does not exist; served: {sorted(models)}", "model")
        return models[name]

    def params_of(req: P.CompletionRequest | P.ChatCompletionRequest, n_prompts: int) -> SamplingParams:
        try:
            params = req.to_sampling_params()
        except ValueError as e:
            raise P.APIError(400, str(e), P.param_of(str(e))) from e
        if params.n * n_prompts > MAX_N:
            raise P.APIError(400, f"n: at most {MAX_N} completions per request (n x prompts)", "n")
        return params

    async def encode(m: ServedModel, prompt: str | list[int], param: str) -> list[int]:
        if not isinstance(prompt, str):
            return prompt
        try:
            return await asyncio.to_thread(m.tokenizer.encode, prompt)
        except Exception as e:
            raise P.APIError(400, f"{param}: could not be tokenized: {e}", param) from e

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
                raise P.APIError(400, f"{param}: {e}", param, n_prompt_tokens=e.n_prompt_tokens, n_ctx=e.n_ctx) from e
            if isinstance(e, QueueFullError):
                raise P.APIError(429, str(e)) from e
            if isinstance(e, ValueError):
                raise P.APIError(400, str(e), P.param_of(str(e)) or param) from e
            raise
        return handles

    async def outputs(m: ServedModel, rs: RequestStreams) -> AsyncIterator[tuple[int, RequestOutput]]:
        seen: set[int] = set()
        async for i, out in rs.outputs():
            metrics.on_output(m.name, out, i not in seen)
            seen.add(i)
            yield i, out

    async def collect(m: ServedModel, rs: RequestStreams) -> list[RequestOutput]:
        final: dict[int, RequestOutput] = {}
        async for i, out in outputs(m, rs):
            if out.finished:
                final[i] = out
        return [final[i] for i in range(len(rs.handles))]

    async def respond(request: Request, m: ServedModel, handles: list[Handle], stream: bool,
                      streamer: Callable[[AsyncIterator[tuple[int, RequestOutput]]], AsyncIterator[dict[str, Any]]],
                      build: Callable[[list[RequestOutput]], dict[str, Any]]) -> Response:
        rs = RequestStreams(handles, abort_soon(m.engine), lambda: metrics.on_abort(m.name))
        if stream:
            return _EngineStream(rs, _sse_body(streamer(outputs(m, rs))))
        try:
            outs = await until_disconnected(request, collect(m, rs))
        except Exception as e:
            raise P.APIError(500, _internal_message(e)) from e
        finally:
            rs.close()
        if outs is None:
            return Response(status_code=499)
        return P.SafeJSONResponse(build(outs))

    @app.post("/v1/completions")
    async def completions(req: P.CompletionRequest, request: Request) -> Response:
        m = model_for(req.model)
        raw = req.prompts()
        params = X.prepare_params(req, params_of(req, len(raw)))
        prompts = [await encode(m, p, "prompt") for p in raw]
        echo = [(p if isinstance(p, str) else m.tokenizer.decode(p)) if req.echo else "" for p in raw]
        scores = await X.scores_for(m, req, prompts)          # prompt logprobs (echo + logprobs, prompt_logprobs)
        if req.echo and req.max_tokens == 0:                   # scoring only: nothing generated
            return P.SafeJSONResponse(X.scoring_only(m, req, echo, scores, prompts))
        handles = await submit(m, prompts, params, "prompt")
        return await respond(request, m, handles, req.stream,
                             lambda s: X.decorate_stream(stream_completion(s, m.name, params.n, echo,
                                                                           req.include_usage)),
                             lambda outs: X.decorate_completion(build_completion(outs, m.name, params.n, echo),
                                                                m, req, scores))

    @app.post("/v1/chat/completions")
    async def chat_completions(req: P.ChatCompletionRequest, request: Request) -> Response:
        m = model_for(req.model)
        plan = X.chat_plan(req, m.tokenizer)                   # tools / tool_choice (hitenter/server/tools.py)
        params = X.prepare_params(req, params_of(req, 1), plan)
        msgs = req.message_dicts()
        text = chat_prompt(m, msgs, req.add_generation_prompt, **plan.template_kwargs())
        prompt = await encode(m, X.continue_final(text, msgs) if req.continue_final_message else text, "messages")
        scores = await X.scores_for(m, req, [prompt])
        handles = await submit(m, [prompt], params, "messages")
        k, tb, echo = req.top_logprobs or 0, m.tokenizer.token_bytes, X.chat_echo_prefix(req)
        return await respond(request, m, handles, req.stream,
                             lambda s: X.decorate_stream(stream_chat(s, m.name, params.n, k, tb, req.include_usage),
                                                         plan, echo),
                             lambda outs: X.decorate_chat(build_chat(outs, m.name, k, tb), m, req, plan, echo, scores))

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        data = [{"id": m.name, "object": "model", "created": m.created, "owned_by": "hitenter", "root": m.name,
                 "max_model_len": m.engine.engine.max_model_len} for m in models.values()]
        return {"object": "list", "data": data}

    @app.post("/tokenize")
    async def tokenize(req: P.TokenizeRequest) -> dict[str, Any]:
        m = model_for(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise P.APIError(400, "prompt: give exactly one of prompt or messages", "prompt")
        if req.messages is not None:
            ids = await encode(m, chat_prompt(m, [x.as_dict() for x in req.messages], req.add_generation_prompt),
                               "messages")
        else:
            ids = (await encode(m, req.prompt or "", "prompt") if req.add_special_tokens
                   else m.tokenizer.encode(req.prompt or "", add_bos=False))
        return {"tokens": ids, "count": len(ids), "max_model_len": m.engine.engine.max_model_len}

    @app.post("/detokenize")
    async def detokenize(req: P.DetokenizeRequest) -> dict[str, Any]:
        m = model_for(req.model)
        vocab = m.engine.engine.model_config.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise P.APIError(400, f"tokens: ids must be in 0..{vocab - 1}, got {bad[:5]}", "tokens")
        return {"prompt": m.tokenizer.decode(req.tokens)}

    @app.get("/health")
    async def health() -> Response:
        if all(m.engine.is_alive for m in models.values()):
            return Response(status_code=200)
        return _error(P.APIError(503, "the engine loop is not running"))

    @app.get("/metrics")
    async def prom() -> Response:
        body = await asyncio.to_thread(metrics.render, {m.name: m.engine for m in models.values()})
        return Response(body, media_type=CONTENT_TYPE)

    include_extra_routes(app)           # /v1/models/{id}, /v1/embeddings, /tokenizer_info
    if playground:
        _mount_playground(app, {m.name: m.engine for m in models.values()})
    else:
        include_fallbacks(app)
    return app


def _mount_playground(app: FastAPI, engines: dict[str, AsyncLLMEngine]) -> None:
    try:
        from fastapi.staticfiles import StaticFiles

        from hitenter.server.playground import WEB_DIR, make_playground_router
    except ImportError:           # the playground is optional
        include_fallbacks(app)
        return
    app.include_router(make_playground_router(engines))
    include_fallbacks(app)             # JSON 404s, before the static mount (which would answer 405)
    if (WEB_DIR / "index.html").exists():
        app.mount("/", StaticFiles(directory=WEB_DIR, html=True), name="playground")    # last: catches the rest


def chat_prompt(m: ServedModel, messages: list[dict[str, Any]], add_generation_prompt: bool, **kw: Any) -> str:
    try:
        return str(m.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **kw))
    except Exception as e:   # a template that rejects the conversation (roles, order) is the caller's error
        raise P.APIError(400, f"messages: the chat template rejected them: {e}", "messages") from e


def _internal_message(e: BaseException) -> str:
    return str(e) if isinstance(e, EngineDeadError) else f"internal error: {type(e).__name__}: {e}"


async def _sse_body(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    try:
        async for c in chunks:
            yield sse(c).encode("utf-8", "replace")
    except Exception as e:           # mid-stream failure: an error event, then [DONE]
        log.exception("stream failed")
        yield sse(P.APIError(500, _internal_message(e)).body()).encode("utf-8", "replace")
    finally:
        await chunks.aclose()       # type: ignore[attr-defined]
    yield DONE.encode()


def serve(model: str | None = None, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          served_model_name: str | None = None, max_queued_requests: int | None = 256,
          extra_models: list[str] | None = None, **engine_kwargs: Any) -> None:
    import uvicorn

    engine = LLMEngine(model, **engine_kwargs)
    extra = {Path(ref).stem: LLMEngine(ref) for ref in (extra_models or [])}
    app = create_app(engine, served_model_name, api_key, max_queued_requests, extra)    # type: ignore[arg-type]
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5)
