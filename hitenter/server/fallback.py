"""Answers for requests no route takes, in the API's error shape: 405 with ``Allow`` for a known path
asked with another method, our JSON 404 for an unknown one, and the playground's static files under
``/`` (``StaticOr405``), which must not swallow API paths."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from hitenter.server.api_error import APIError


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
