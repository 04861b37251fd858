"""What the peer-conformance tests (tests/server/{openai,anthropic,responses}/test_peer_conformance.py, the
peers' own suites ported) share: their tool and conversation fixtures and the two ways they call a live server,
all under the served model name MODEL."""

from __future__ import annotations

import json
from typing import Any

import httpx

from hitenter.testing.live_server import LiveServer

MODEL = "test"
CITY = {"type": "object", "properties": {"location": {"type": "string", "pattern": "^[a-z]{1,6}$"}},
        "required": ["location"], "additionalProperties": False}
ANT_TOOL = {"name": "get_weather", "description": "Get the current weather in a location", "input_schema": CITY}
OAI_TOOL = {"type": "function", "name": "get_weather", "description": "weather", "parameters": CITY, "strict": True}
USE = [{"role": "user", "content": "What's the weather?"},
       {"role": "assistant", "content": [{"type": "tool_use", "id": "test123", "name": "get_weather",
                                          "input": {"location": "Paris"}}]}]


def post(server: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": MODEL, **body}, timeout=60)


def events(server: LiveServer, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``data:`` objects of a named-event stream."""
    with httpx.stream("POST", server.url + path, json={"model": MODEL, "stream": True, **body}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
