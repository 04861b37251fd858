"""Cross-origin access for browser front-ends (``--allowed-origins``, vLLM's flag).

Default: none. A page on another origin gets no ``Access-Control-Allow-*`` headers, so a browser lets
it neither read the answers nor send JSON bodies. The reason is the usual setup: a server on the
user's own machine, often without ``--api-key``, would otherwise be drivable by any web page the user
happens to visit (Ollama likewise admits only local origins by default; vLLM's default is ``*``).
``--allowed-origins http://localhost:3000`` (repeatable, or comma-separated; ``*`` for any) admits
those origins for every method and header; credentials (cookies) are never allowed, the API key
travels in a header.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware


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
