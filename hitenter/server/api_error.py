"""The server's error model and every refusal it answers around a route.

- ``APIError`` (status, message, param), rendered in the shape of the API the request's path belongs to
  (``dialect_of``): OpenAI / vLLM (``/v1/*``, everything else) ``{"error": {message, type, param, code}}``;
  Anthropic (``/v1/messages*``) ``{"type": "error", "error": {"type", "message"}}``; Ollama (``/api/*``)
  ``{"error": "message"}``; pydantic validation errors mapped onto it; the body models the OpenAPI
  schema declares for error responses.
- The exception handlers (``install_error_handlers``; the middleware around the routes is in
  middleware.py, the ``--api-key`` check in auth.py).
- ``check_known_fields``: a /v1 body's fields the request model does not define are a 400 naming them.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from hitenter.engine.async_engine import EngineDeadError


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
    """The error's response; one that carries a ``pacer`` (an object with ``delay(client) -> seconds``, e.g.
    body_limits.RefusalPacer) is answered that much later for the client's address."""
    assert isinstance(exc, APIError)
    pacer = getattr(exc, "pacer", None)
    if pacer is not None:
        delay = pacer.delay(request.client.host if request.client else "")
        if delay:
            await asyncio.sleep(delay)
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
