"""The HTTP server (FastAPI): every API surface on one port, each endpoint a serving_*.py module
behind one EngineClient per served model (hitenter/server/engine_client.py):

- OpenAI: /v1/completions, /v1/chat/completions, /v1/embeddings, /v1/models (serving_completion,
  serving_chat, serving_embedding, serving_models), /v1/responses (serving_responses);
- Anthropic: /v1/messages, /v1/messages/count_tokens (serving_messages);
- Ollama: /api/chat, /api/generate (serving_ollama), /api/tags, /api/show, /api/ps, /api/version,
  /api/embed, /api/embeddings (serving_ollama_models), /api/pull, /api/delete (serving_ollama_pull);
- vLLM's /tokenize, /detokenize, /tokenizer_info (serving_tokenize); /health and /metrics
  (serving_admin); the playground (playground*.py);
- reranking: /v1/rerank, /rerank, /v2/rerank (llama-server's, Jina's, Cohere's, TEI's shapes) and vLLM's
  /score, /v1/score (serving_rerank).

This module assembles the app: clients, guards (body limit, framing, errors, CORS), and ``--api-key``
on every router that runs the model, tokenizes or shows requests (only the static page and /health
stay open)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from hitenter.engine.async_engine import AsyncLLMEngine
from hitenter.engine.llm_engine import LLMEngine
from hitenter.engine_options import engine_config
from hitenter.server import body_limits as L
from hitenter.server import (
    serving_admin,
    serving_chat,
    serving_completion,
    serving_embedding,
    serving_messages,
    serving_models,
    serving_ollama,
    serving_ollama_models,
    serving_ollama_pull,
    serving_rerank,
    serving_responses,
    serving_tokenize,
)
from hitenter.server.api_error import SafeJSONResponse, error_responses, install_error_handlers
from hitenter.server.auth import api_key_dependency
from hitenter.server.engine_client import EngineClient
from hitenter.server.generation import Puller, ServedModel, ServerState
from hitenter.server.http import DEFAULT_HEADER_TIMEOUT, StaticOr405, add_cors, uvicorn_config
from hitenter.server.lifecycle import Lifecycle
from hitenter.server.local_engine import LocalEngineClient
from hitenter.server.metrics import ServerMetrics
from hitenter.server.middleware import (
    DEFAULT_MAX_BODY_BYTES,
    BodyLimitMiddleware,
    BoundedBodyMiddleware,
    CatchAllMiddleware,
)
from hitenter.server.model_catalog import Catalog
from hitenter.server.model_manager import LeaseScope, Loader, ModelManager
from hitenter.server.schema_types import TOKEN_ID_LIMIT

__all__ = ["ServedModel", "create_app", "model_name", "serve"]
Served = LLMEngine | AsyncLLMEngine | EngineClient
API_ROUTERS = [serving_completion.router, serving_chat.router, serving_embedding.router, serving_models.router,
               serving_tokenize.router, serving_responses.router, serving_messages.router, serving_ollama.router,
               serving_ollama_models.router, serving_ollama_pull.router, serving_rerank.router]


BOUNDED_PATHS = ("/v1/", "/v2/", "/api/", "/tokenize", "/detokenize", "/rerank", "/score")   # the API bodies body_limits bounds


def _served(name: str | None, e: Served, max_queued: int | None) -> ServedModel:
    """An LLMEngine is wrapped in an AsyncLLMEngine the app owns (and shuts down with it); an engine gets
    a LocalEngineClient; a client is served as it is."""
    owned = isinstance(e, LLMEngine)
    if isinstance(e, LLMEngine | AsyncLLMEngine):
        client: EngineClient = LocalEngineClient(AsyncLLMEngine(e, max_queued) if owned else e)  # type: ignore[arg-type]
    else:
        client = e
    if max_queued is not None:
        client.set_max_queued(max_queued)
    return ServedModel(name or model_name(client.info.path or "model"), client, owned)


def create_app(engine: Served, served_model_name: str | None = None, api_key: str | None = None,
               max_queued_requests: int | None = None, extra_engines: dict[str, Served] | None = None,
               playground: bool = True, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, metrics_public: bool = False,
               allow_special_tokens_in_content: bool = False, allowed_origins: list[str] | None = None,
               limits: L.Limits | None = None, pull: Puller | None = None, lifecycle: Lifecycle | None = None,
               loader: Loader | None = None, reasoning_budget: int = -1) -> FastAPI:
    """The app. ``max_queued_requests``, when given, is set on every engine; ``playground`` mounts
    the web playground (its API under /playground/api, the page at /) when it is installed;
    ``allowed_origins``: the browser origins allowed cross-origin calls (CORS; none by default);
    ``limits``: depth, size and grammar-compilation bounds (hitenter/server/body_limits.py; the defaults when None);
    ``pull``: what /api/pull runs, ``(name, progress)`` (hitenter.models.registry.pull when None);
    ``loader``: loads a model a request names that is not resident, ``(name, file) -> ServedModel``
    (None: only the models given here are served); ``lifecycle``: keep-alive and the resident limits
    (hitenter/server/model_manager.py); ``reasoning_budget``: the thinking tokens a reply may take when the
    request gives no budget (-1: unbounded; 0: the section closes as it opens)."""
    if not isinstance(reasoning_budget, int) or reasoning_budget < -1:
        raise ValueError(f"reasoning_budget: must be -1 (unbounded) or an integer >= 0, got {reasoning_budget!r}")
    L.configure(limits or L.Limits())
    models = {m.name: m for m in [_served(served_model_name, engine, max_queued_requests)]}
    for name, e in (extra_engines or {}).items():
        models[name] = _served(name, e, max_queued_requests)
    manager = ModelManager(lifecycle, loader, Catalog() if loader is not None else None)
    for m in models.values():
        _ = m.max_prompt_chars     # now, not on the first request's event loop (slow for a large vocabulary)
        manager.add(m)
    state = ServerState(manager, ServerMetrics(list(models)), allow_special_tokens_in_content, pull=pull,
                        default_name=next(iter(models)), reasoning_budget=reasoning_budget)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await manager.close()

    app = FastAPI(title="hitenter", version="0.1.0", lifespan=lifespan, default_response_class=SafeJSONResponse)
    app.state.server = state
    app.state.models, app.state.metrics = models, state.metrics
    app.add_middleware(BoundedBodyMiddleware, prefixes=BOUNDED_PATHS)     # inside the body limit
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=max_body_bytes)
    install_error_handlers(app)
    app.add_middleware(CatchAllMiddleware)                # a bug in a route: a 500, the connection kept
    app.add_middleware(LeaseScope, manager=manager)       # a request's models are held until it is answered
    guarded: dict[str, Any] = {}
    if api_key:
        guarded = {"dependencies": [api_key_dependency(api_key)], "responses": error_responses(401)}
    for router in API_ROUTERS:
        app.include_router(router, **guarded)
    app.include_router(serving_admin.health_router)
    app.include_router(serving_admin.metrics_router, **({} if metrics_public else guarded))
    if playground:   # without it Starlette's own 404 / 405 (+ Allow) answer unknown paths, in our shape
        _mount_playground(app, {m.name: m.client for m in models.values()}, guarded)
    infos = [m.client.info for m in models.values()]
    _schema_for_served(app, state.roles(), min(i.vocab_size for i in infos), {i.hidden_size for i in infos},
                       None if manager.loads_on_demand() else list(models))
    add_cors(app, allowed_origins)       # outermost: errors and preflights carry the CORS headers too
    return app


def _schema_for_served(app: FastAPI, roles: list[str], vocab: int, hidden: set[int], names: list[str] | None) -> None:
    """What the schema can say about the served models: the chat roles every template supports, token
    ids below the smallest vocabulary (the static bound is 2**31), the embedding size (when the
    models share one), and the served names as the ``model`` of the newer surfaces' bodies (Ollama's
    also with its ``:latest`` tag)."""
    build = app.openapi

    def bound_ids(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("exclusiveMaximum") == TOKEN_ID_LIMIT:
                node["exclusiveMaximum"] = vocab
            for v in node.values():
                bound_ids(v)
        elif isinstance(node, list):
            for v in node:
                bound_ids(v)

    def openapi() -> dict[str, Any]:
        schema = build()
        components = schema.get("components", {}).get("schemas", {})
        role = components.get("ChatMessage", {}).get("properties", {}).get("role")
        if role is not None:
            role["enum"] = roles
        dims = components.get("EmbeddingRequest", {}).get("properties", {}).get("dimensions")
        if dims is not None and len(hidden) == 1:
            dims["anyOf"] = [{"type": "integer", "const": next(iter(hidden))}, {"type": "null"}]
        bound_ids(components)
        bound_ids(schema.get("paths", {}))     # bodies documented inline (the playground's)
        if names is not None:      # None: any name may be loaded on demand
            _model_enum(schema, names)
        return schema
    app.openapi = openapi    # type: ignore[method-assign]


_NAMED_BODIES = ("/api/", "/v1/messages", "/v1/responses")


def _model_enum(schema: dict[str, Any], names: list[str]) -> None:
    """``model`` of the request bodies under ``_NAMED_BODIES`` is one of the served names."""
    components = schema.get("components", {}).get("schemas", {})
    for path, item in schema.get("paths", {}).items():
        if not path.startswith(_NAMED_BODIES):
            continue
        for op in item.values():
            ref = (op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
                   .get("$ref", ""))
            model = components.get(ref.rsplit("/", 1)[-1], {}).get("properties", {}).get("model")
            if model is not None:
                tagged = [f"{n}:latest" for n in names if ":" not in n] if path.startswith("/api/") else []
                named = {"type": "string", "enum": names + tagged}
                optional = any(b.get("type") == "null" for b in model.pop("anyOf", []))
                model.pop("type", None)
                model.update({"anyOf": [named, {"type": "null"}]} if optional else named)


def _mount_playground(app: FastAPI, clients: dict[str, EngineClient], guarded: dict[str, Any]) -> None:
    try:
        from fastapi.staticfiles import StaticFiles

        from hitenter.server.playground import WEB_DIR, make_playground_router
    except ImportError:           # the playground is optional
        return
    responses = {**error_responses(400, 404, 413, 429), **guarded.get("responses", {})}
    app.include_router(make_playground_router(clients), **{**guarded, "responses": responses})  # behind the key
    if (WEB_DIR / "index.html").exists():     # last: catches the rest
        app.mount("/", StaticOr405(app, StaticFiles(directory=WEB_DIR, html=True), WEB_DIR), name="playground")


def model_name(ref: str) -> str:
    """The name a model reference is served under: a known name as written (``qwen2.5-coder-0.5b-instruct``,
    never cut at its last dot), a file or ``hf:`` reference by its file name without ``.gguf``."""
    last = ref.rstrip("/").rsplit("/", 1)[-1]
    return last[:-len(".gguf")] if last.lower().endswith(".gguf") else last


_PER_MODEL = ("speculative_model", "speculative_method", "num_speculative_tokens")   # the started model's own


def engine_loader(engine_kwargs: dict[str, Any], max_queued: int | None) -> Loader:
    """Loads a model a request names: an LLMEngine with the server's engine options (not the started
    model's speculative ones), served like the started models."""
    kw = {k: v for k, v in engine_kwargs.items() if k not in _PER_MODEL}

    def load(name: str, ref: str) -> ServedModel:
        m = _served(name, LLMEngine(config=engine_config(ref, None, kw)), max_queued)
        _ = m.max_prompt_chars        # in the loading thread, not on the first request's event loop
        return m
    return load


def serve(model: str | None = None, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          served_model_name: str | None = None, max_queued_requests: int | None = 256,
          extra_models: list[str] | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
          header_timeout: float = DEFAULT_HEADER_TIMEOUT, metrics_public: bool = False,
          allow_special_tokens_in_content: bool = False, allowed_origins: list[str] | None = None,
          limits: L.Limits | None = None, lifecycle: Lifecycle | None = None, reasoning_budget: int = -1,
          **engine_kwargs: Any) -> None:
    import uvicorn

    engine = LLMEngine(config=engine_config(model, None, engine_kwargs))
    extra = {model_name(ref): LLMEngine(ref) for ref in (extra_models or [])}
    app = create_app(engine, served_model_name, api_key, max_queued_requests, extra,    # type: ignore[arg-type]
                     max_body_bytes=max_body_bytes, metrics_public=metrics_public,
                     allow_special_tokens_in_content=allow_special_tokens_in_content,
                     allowed_origins=allowed_origins, limits=limits, lifecycle=lifecycle,
                     loader=engine_loader(engine_kwargs, max_queued_requests), reasoning_budget=reasoning_budget)
    uvicorn.Server(uvicorn_config(app, host, port, header_timeout, log_level="info")).run()
