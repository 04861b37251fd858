"""Every error the server answers, in the shape of the API its path belongs to (api_error.dialect_of:
vLLM's ``{"error": {message, type, param, code}}``, Anthropic's, Ollama's): the exception handlers, the
catch-all that turns a bug into a 500 without dropping the connection, and the error responses declared
in the OpenAPI schema."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hitenter.engine.async_engine import EngineDeadError
from hitenter.server.api_error import DIALECT_BODIES, APIError, ErrorBody, dialect_of, validation_error

log = logging.getLogger("hitenter.server")

_DESCRIPTIONS = {400: "Bad request: a parameter (named in `param`) or the body is invalid",
                 401: "Missing or wrong API key (`Authorization: Bearer <key>` or `x-api-key: <key>`)",
                 404: "Unknown model or path", 413: "Request body too large",
                 429: "Too many queued requests; retry after `Retry-After` seconds"}


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
