"""The playground's server for the page tests: the tiny random Llama and the trigram toy behind the real app."""

from __future__ import annotations

import pytest

from hitenter.testing.live_server import live_server
from hitenter.testing.playground_page import TINY_OPTS


@pytest.fixture(scope="module")
def server(tiny_llama_path):
    """The OpenAI server app with the playground mounted, on a loopback port: (base url, engines)."""
    from hitenter.engine.llm_engine import LLMEngine
    from hitenter.server.api import create_app

    tiny = LLMEngine(str(tiny_llama_path), **TINY_OPTS)
    tri = LLMEngine("trigram", kv_cache_memory=1 << 16, block_size=4)
    app = create_app(tiny, "tiny", extra_engines={"trigram": tri})   # mounts the playground, as `hitenter serve` does
    engines = {name: m.engine for name, m in app.state.models.items()}
    with live_server(app) as srv:
        yield srv.url, {n: e.engine for n, e in engines.items()}


