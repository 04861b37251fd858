"""The server's error model and every refusal it answers around a route.

- ``APIError`` (status, message, param), rendered in the shape of the API the request's path belongs to
  (``dialect_of``): OpenAI / vLLM (``/v1/*``, everything else) ``{"error": {message, type, param, code}}``;
  Anthropic (``/v1/messages*``) ``{"type": "error", "error": {"type", "message"}}``; Ollama (``/api/*``)
  ``{"error": "message"}``; pydantic validation errors mapped onto it; the body models the OpenAPI
  schema declares for error responses.
- The exception handlers and the catch-all that turns a bug into a 500 without dropping the connection.
- Request framing guards before any parsing: the body size limit (413; a body without Content-Length is
  counted as it streams; the rest of an oversized body is drained up to ``DRAIN_CAP`` bytes so the client
  gets the 413, then the connection closes) and ambiguous framing (Content-Length with
  Transfer-Encoding, or two Content-Lengths: request smuggling bait; 400, close); then
  ``BoundedBodyMiddleware``: the depth and size bounds of hitenter/server/body_limits.py on every API body.
- ``check_known_fields``: a /v1 body's fields the request model does not define are a 400 naming them.
- ``--api-key``: a dependency on every router that runs the model, tokenizes or shows requests; the key
  is read from ``Authorization: Bearer <key>`` (OpenAI, Ollama clients) or ``x-api-key`` (Anthropic).
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hitenter.engine.async_engine import EngineDeadError
from hitenter.server import body_limits


class SafeJSONResponse(JSONResponse):
    """JSON whose strings may hold lone surrogates (from ``\\ud800`` escapes in a request): replaced, not a 500."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8", "replace")


class APIError(Exception):
    """An error with an HTTP status, rendered as ``{"error": {message, type, param, code, **extra}}``."""

    TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
             405: "MethodNotAllowedError", 408: "RequestTimeoutError", 413: "RequestTooLargeError",
             429: "RateLimitError", 500: "InternalServerError", 501: "NotImplementedError",
             503: "ServiceUnavailableError"}
    HEADERS = {401: {"WWW-Authenticate": "Bearer"}, 429: {"Retry-After": "1"}}

    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = {**self.HEADERS.get(status, {}), **(headers or {})}
        self.extra = extra

    def response(self, path: str = "") -> JSONResponse:
        """The error response in the dialect of ``path`` (OpenAI's when none is given)."""
        return SafeJSONResponse(self.body(dialect_of(path)), status_code=self.status, headers=self.headers)

    def body(self, dialect: str = "openai") -> dict[str, Any]:
        if dialect == "anthropic":
            return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(self.status, "api_error"),
                                               "message": self.message}}
        if dialect == "ollama":
            return {"error": self.message}
        err: dict[str, Any] = {"message": self.message, "type": self.TYPES.get(self.status, "APIError"),
                               "param": self.param, "code": self.status}
        err.update(self.extra)
        return {"error": err}


ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error",
                   413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 501: "api_error",
                   503: "overloaded_error"}


def dialect_of(path: str) -> str:
    """Which API's error shape a path answers in: "anthropic", "ollama" or "openai"."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "anthropic"
    if path == "/api" or path.startswith("/api/"):
        return "ollama"
    return "openai"


def overflow_error(param: str, n_prompt: int, n_ctx: int, max_tokens: int | None = None,
                   detail: str = "") -> APIError:
    """A context overflow (400) in OpenAI's wording, which clients (LangChain, LiteLLM) search for
    ("maximum context length") to trim a conversation, with ``n_prompt_tokens`` / ``n_ctx`` (llama.cpp)."""
    asked = n_prompt + (max_tokens or 0)
    msg = (f"This model's maximum context length is {n_ctx} tokens. However, you requested {asked} tokens "
           f"({n_prompt} in the {param}, {max_tokens or 0} in the completion). Please reduce the length of the "
           f"{param} or completion." + (f" ({detail})" if detail else ""))
    return APIError(400, f"{param}: {msg}", param, n_prompt_tokens=n_prompt, n_ctx=n_ctx)


def param_of(message: str) -> str | None:
    """SamplingParams/engine ValueErrors start with the field name: ``"top_p: must be ..."``."""
    head, sep, _ = message.partition(":")
    return head if sep and head.isidentifier() else None


_BRANCHES = frozenset({"str", "int", "float", "bool", "dict", "list", "none", "literal"})


def _field_path(loc: tuple[Any, ...]) -> list[str]:
    """A pydantic error location without "body" and without the union branch tags pydantic adds
    (``str``, ``list[int]``, ``tagged-union[...]``, ``function-after[...]``)."""
    return [str(x) for x in loc if x != "body" and not (isinstance(x, str) and ("[" in x or x in _BRANCHES))]


def validation_error(exc: RequestValidationError) -> APIError:
    """A 400 naming the most specific field that failed (the deepest location: inside a union the
    branch that got furthest), with the first few reasons."""
    errs = exc.errors()
    if not errs:
        return APIError(400, "invalid request")
    if errs[0].get("type") == "json_invalid":
        return APIError(400, f"invalid JSON body: {errs[0].get('msg', '')}")
    deepest = max(errs, key=lambda e: len(_field_path(e.get("loc", ()))))
    param = ".".join(_field_path(deepest.get("loc", ()))) or None
    ordered = [deepest] + [e for e in errs if e is not deepest]
    msgs = "; ".join(f"{'.'.join(_field_path(e.get('loc', ()))) or 'body'}: "
                     f"{str(e.get('msg', '')).removeprefix('Value error, ')}" for e in ordered[:5])
    return APIError(400, msgs, param)


METADATA_FIELDS = frozenset({"user"})       # sent by clients as pure metadata (no effect on generation)


def check_known_fields(req: BaseModel) -> None:
    """400 for fields the request model does not define (``extra="allow"`` keeps them in model_extra);
    ``stream_options`` without ``stream`` is a 400 too (as vLLM does)."""
    extra = sorted(set(req.model_extra or {}) - METADATA_FIELDS)
    if extra:
        raise APIError(400, f"{extra[0]}: unsupported request field(s) {extra}; see the README for the fields "
                       "this server implements", extra[0])
    if getattr(req, "stream_options", None) is not None and not getattr(req, "stream", False):
        raise APIError(400, "stream_options: only allowed when stream is true", "stream_options")


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorBody(BaseModel):
    """Every error response: vLLM's shape."""
    error: ErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorBody(BaseModel):
    """Every error of the Anthropic paths (/v1/messages*)."""
    type: str
    error: AnthropicErrorDetail


class OllamaErrorBody(BaseModel):
    """Every error of the Ollama paths (/api/*)."""
    error: str


DIALECT_BODIES: dict[str, type[BaseModel]] = {"openai": ErrorBody, "anthropic": AnthropicErrorBody,
                                              "ollama": OllamaErrorBody}


log = logging.getLogger("hitenter.server")


_DESCRIPTIONS = {400: "Bad request: a parameter (named in `param`) or the body is invalid",
                 401: "Missing or wrong API key (`Authorization: Bearer <key>` or `x-api-key: <key>`)",
                 404: "Unknown model or path", 413: "Request body too large",
                 409: "The model is in use (it is being served)",
                 429: "Too many queued requests; retry after `Retry-After` seconds",
                 502: "The model's download failed (the package index could not be reached or sent a bad file)"}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for these statuses, each with the error body model."""
    return {s: {"model": ErrorBody, "description": _DESCRIPTIONS.get(s, "Error")} for s in statuses}


def internal_message(e: BaseException) -> str:
    return str(e) if isinstance(e, EngineDeadError) else f"internal error: {type(e).__name__}: {e}"


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return exc.response(request.url.path)


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return validation_error(exc).response(request.url.path)


async def _http(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own errors (404 path, 405 method with its ``Allow`` header, a router's HTTPException)."""
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers.setdefault("Allow", "GET, HEAD")    # the static files' 405 (routes send their own Allow)
    return APIError(exc.status_code, str(exc.detail), headers=headers).response(request.url.path)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_middleware(CatchAllMiddleware)
    _openapi_with_our_errors(app)


def _openapi_with_our_errors(app: FastAPI) -> None:
    """FastAPI documents its 422 validation body on every route; ours is a 400 with the error body, and
    every error body of a path is the one of its API (api_error.dialect_of)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            for path, item in schema.get("paths", {}).items():
                ref = {"$ref": f"#/components/schemas/{DIALECT_BODIES[dialect_of(path)].__name__}"}
                for op in item.values():
                    _our_errors(op.get("responses", {}), ref)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                components.pop(name, None)
            for model in DIALECT_BODIES.values():
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(body.pop("$defs", {}))
                components.setdefault(model.__name__, body)
            app.openapi_schema = schema
        return app.openapi_schema
    app.openapi = openapi    # type: ignore[method-assign]


def _our_errors(responses: dict[str, Any], ref: dict[str, str]) -> None:
    """A 400 instead of FastAPI's 422, and ``ref`` as every error response's body."""
    if responses.pop("422", None) is not None:
        responses.setdefault("400", {"description": _DESCRIPTIONS[400]})
    for code, r in responses.items():
        if code[:1] in ("4", "5"):
            r["content"] = {"application/json": {"schema": ref}}


class CatchAllMiddleware:
    """A bug in a route becomes a 500 in our shape and the connection stays usable. (Starlette's
    ServerErrorMiddleware re-raises after answering, and uvicorn then closes the keep-alive
    connection: the client's next request on it was reset.)"""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as e:
            log.exception("internal error")
            if not started:
                await APIError(500, internal_message(e)).response(scope["path"])(scope, receive, send)


DEFAULT_MAX_BODY_BYTES = 4 << 20


DRAIN_CAP = 64 << 20


_CLOSE = {"Connection": "close"}


def framing_problem(headers: list[tuple[bytes, bytes]], limit: int) -> APIError | None:
    lengths = [v for k, v in headers if k == b"content-length"]
    chunked = any(k == b"transfer-encoding" for k, _ in headers)
    if lengths and chunked or len(lengths) > 1:
        return APIError(400, "ambiguous framing: send either Content-Length or Transfer-Encoding, once",
                          headers=_CLOSE)
    if not lengths:
        return None
    try:
        n = int(lengths[0])
    except ValueError:
        return APIError(400, "Content-Length is not a number", headers=_CLOSE)
    return too_large(limit) if n > limit else None


def too_large(limit: int) -> APIError:
    return APIError(413, f"request body too large: the limit is {limit} bytes (--max-body-bytes)",
                      headers=_CLOSE)


async def _drain(receive: Receive, seen: int = 0) -> None:
    while seen <= DRAIN_CAP:
        msg = await receive()
        if msg["type"] != "http.request" or not msg.get("more_body", False):
            return
        seen += len(msg.get("body", b""))


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app, self.limit = app, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = framing_problem(scope["headers"], self.limit)
        if problem is not None:
            if problem.status == 413:
                await _drain(receive)
            await problem.response(scope["path"])(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            msg = await receive()
            if msg["type"] == "http.request":
                received += len(msg.get("body", b""))
                if received > self.limit:
                    if msg.get("more_body", False):
                        await _drain(receive, received)
                    err = too_large(self.limit)    # raised to the route, answered by the HTTPException handler
                    raise HTTPException(413, err.message, headers=err.headers)
            return msg

        await self.app(scope, counted, send)


class BoundedBodyMiddleware:
    """The bounds of hitenter/server/body_limits.py on the JSON body of every POST under ``prefixes``,
    before the app parses it: the body is read (its size is already bounded by BodyLimitMiddleware,
    outside this one), checked (bodies over 64 KiB in the body-check worker process: the parse holds the
    GIL), and replayed to the app. A body too deep for the JSON parser itself is refused naming its field,
    as is one over the limits; the error is in the API's own shape (by path)."""

    def __init__(self, app: ASGIApp, prefixes: tuple[str, ...]) -> None:
        self.app, self.prefixes = app, prefixes
        body_limits.CHECKER.warm()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope.get("method") != "POST" or not path.startswith(self.prefixes):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        try:
            while more:
                msg = await receive()
                if msg["type"] != "http.request":
                    return                              # the client left
                chunks.append(msg.get("body", b""))
                more = msg.get("more_body", False)
        except HTTPException as e:                      # the body limit (413), raised from its receive
            await APIError(e.status_code, str(e.detail), headers=dict(e.headers or {})).response(path)(
                scope, receive, send)
            return
        body = b"".join(chunks)
        r = await body_limits.problem(body, (scope.get("client") or ("",))[0])
        if r is not None:
            await APIError(r.status, r.message, r.param).response(path)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


_bearer = HTTPBearer(auto_error=False, description="the server's --api-key")


_x_api_key = APIKeyHeader(name="x-api-key", auto_error=False, description="the server's --api-key (Anthropic clients)")


Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


XApiKey = Annotated[str | None, Depends(_x_api_key)]


def api_key_dependency(api_key: str) -> Any:
    """``Depends(...)`` that answers 401 (with ``WWW-Authenticate: Bearer``) unless a key matches."""
    expected = api_key.encode()

    async def require_api_key(creds: Credentials, x_api_key: XApiKey) -> None:
        sent = [creds.credentials if creds is not None else "", x_api_key or ""]
        if not any(secrets.compare_digest(k.encode(), expected) for k in sent):
            raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>' "
                           "(or 'x-api-key: <key>')")

    return Depends(require_api_key)
