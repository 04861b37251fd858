"""The HTTP server (OpenAI's, Anthropic's and Ollama's APIs on one port): ``create_app(engine)`` builds
the FastAPI app in-process,
``serve(model=..., host=..., port=...)`` is what ``hitenter serve`` runs. Imported lazily (no torch on import)."""

from __future__ import annotations

from typing import Any

__all__ = ["create_app", "serve"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from hitenter.server import api

        return getattr(api, name)
    raise AttributeError(name)
