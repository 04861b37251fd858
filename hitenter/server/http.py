"""What the app is served with and what answers outside the routes.

- uvicorn settings: h11 with a deadline for reading a request's headers (``GuardedH11Protocol``: every
  request gets ``header_timeout`` seconds from its first byte to complete its headers, then 408 and
  close; header size bounded by h11, keep-alive idling by ``timeout_keep_alive``).
- Cross-origin access for browser front-ends (``--allowed-origins``, vLLM's flag). Default: none. A
  server on the user's own machine, often without ``--api-key``, would otherwise be drivable by any web
  page the user visits (Ollama likewise admits only local origins by default; vLLM's default is ``*``).
  Origins given are admitted for every method and header; credentials (cookies) never.
- Requests no route takes: 405 with ``Allow`` for a known path asked with another method, our JSON 404
  for an unknown one, and the playground's static files under ``/`` (``StaticOr405``), which must not
  swallow API paths.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import h11
import uvicorn
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from hitenter.server.api_error import APIError

DEFAULT_HEADER_TIMEOUT = 10.0


_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n%s")


_408_BODY = (b'{"error":{"message":"request headers not received in time","type":"RequestTimeoutError",'
             b'"param":null,"code":408}}')


class GuardedH11Protocol(H11Protocol):
    header_timeout: float = DEFAULT_HEADER_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        if self._header_deadline is None:
            self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:         # bytes of a new request's head
            self._arm()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:     # its headers are complete
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is not h11.IDLE:     # a pipelined request already read on
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self.cycle is None or self.cycle.response_complete:
                self.transport.write(_408 % (len(_408_BODY), _408_BODY))
            self.transport.close()


def uvicorn_config(app: Any, host: str = "127.0.0.1", port: int = 8000,
                   header_timeout: float = DEFAULT_HEADER_TIMEOUT, **kwargs: Any) -> uvicorn.Config:
    protocol = type("HeaderTimeoutH11", (GuardedH11Protocol,), {"header_timeout": header_timeout})
    kwargs.setdefault("timeout_keep_alive", 5)
    kwargs.setdefault("timeout_graceful_shutdown", 5)
    return uvicorn.Config(app, host=host, port=port, http=protocol, **kwargs)


def parse_origins(values: Iterable[str] | None) -> list[str]:
    """Origins from flag values, each of which may hold several separated by commas."""
    return [o.strip().rstrip("/") for v in values or [] for o in v.split(",") if o.strip()]


def add_cors(app: FastAPI, origins: Iterable[str] | None) -> None:
    """Answer preflights and add the CORS headers for ``origins`` (nothing when there are none). Call
    last, so that the middleware is outermost and error responses carry the headers too."""
    allowed = parse_origins(origins)
    if allowed:
        app.add_middleware(CORSMiddleware, allow_origins=allowed, allow_methods=["*"], allow_headers=["*"],
                           allow_credentials=False, max_age=600)


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """The methods the app's documented routes take at ``path`` (empty: no route there)."""
    methods = getattr(app.state, "route_methods", None)
    if methods is None:
        methods = {p: sorted(m.upper() for m in ops) for p, ops in app.openapi()["paths"].items()}
        app.state.route_methods = methods
    return methods.get(path, [])


def not_found_or_405(app: FastAPI, method: str, path: str) -> APIError:
    """405 with ``Allow`` for a known path asked with another method, else our JSON 404."""
    allowed = allowed_methods(app, path)
    if allowed:
        return APIError(405, "Method Not Allowed", headers={"Allow": ", ".join(allowed)})
    return APIError(404, f"no route {method} {path}")


def _api_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in ("/v1", "/api"))


class StaticOr405:
    """The page's files, except that an API path asked with the wrong method gets 405 with ``Allow``
    (under a catch-all mount Starlette would answer it 404 from the static files), an unknown /v1 or
    /api path our JSON 404 (never a 405), a page file asked with another method than GET / HEAD a 405,
    and any other path asked with another method our JSON 404 (``POST /chat/completions``: a base URL
    without /v1)."""

    def __init__(self, app: FastAPI, static: ASGIApp, root: Path) -> None:
        self.app, self.static, self.root = app, static, root.resolve()

    def _is_page(self, path: str) -> bool:
        target = (self.root / path.lstrip("/")).resolve()
        if target != self.root and self.root not in target.parents:
            return False
        return target.is_file() or (target / "index.html").is_file()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path, method = scope["path"], scope.get("method", "GET")
            if allowed_methods(self.app, path) or _api_path(path):
                await not_found_or_405(self.app, method, path).response(path)(scope, receive, send)
                return
            if method not in ("GET", "HEAD"):    # the page's files take GET / HEAD only
                err = (APIError(405, "Method Not Allowed", headers={"Allow": "GET, HEAD"}) if self._is_page(path)
                       else APIError(404, f"no route {method} {path}"))
                await err.response(path)(scope, receive, send)
                return
        await self.static(scope, receive, send)
