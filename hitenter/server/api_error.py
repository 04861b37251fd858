"""The server's error model: ``APIError`` (status, message, param), rendered in the shape of the API
the request's path belongs to (``dialect_of``):

- OpenAI / vLLM (``/v1/*``, everything else): ``{"error": {message, type, param, code}}``;
- Anthropic (``/v1/messages*``): ``{"type": "error", "error": {"type": "invalid_request_error", "message"}}``;
- Ollama (``/api/*``): ``{"error": "message"}``.

Also the mapping of pydantic validation errors onto it, and the body models the OpenAPI schema declares
for error responses (hitenter/server/errors.py installs the handlers)."""

from __future__ import annotations

import json
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel


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

