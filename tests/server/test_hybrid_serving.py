"""A hybrid (recurrent-state) model behind every API: chat, completions, structured output, seeds, the four
APIs' surfaces and the playground's streams answer as they do for a transformer, a chat's second turn is
served from a state snapshot (usage's cached tokens), and nothing answers 5xx."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.testing.live_server import LiveServer, live_server
from hitenter.testing.tiny_hybrids import write_tiny_hybrid

pytestmark = pytest.mark.slow
MSG = [{"role": "user", "content": "hello there, tell me something"}]


@pytest.fixture(scope="module", params=["qwen35", "lfm2"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    path = write_tiny_hybrid(tmp_path_factory.mktemp("hybrid") / f"{request.param}.gguf", request.param, seed=1,
                             quant="Q8_0")
    with live_server(create_app(LLMEngine(str(path)), served_model_name="tiny")) as srv:
        yield srv


def _post(srv: LiveServer, path: str, body: dict) -> httpx.Response:  # type: ignore[type-arg]
    r = httpx.post(srv.url + path, json=body, timeout=120)
    assert r.status_code < 500, r.text
    return r


def test_every_api_answers(server: LiveServer) -> None:
    base = {"model": "tiny", "max_tokens": 8}
    assert _post(server, "/v1/chat/completions", {**base, "messages": MSG}).json()["choices"][0]["message"]
    assert _post(server, "/v1/completions", {**base, "prompt": "once upon"}).json()["choices"][0]["text"] is not None
    assert _post(server, "/v1/messages", {**base, "messages": MSG}).json()["content"] is not None
    assert _post(server, "/api/chat", {"model": "tiny", "messages": MSG, "stream": False,
                                       "options": {"num_predict": 8}}).json()["message"]
    r = _post(server, "/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 16})
    assert r.status_code == 200 and r.json()["output"]
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**base, "messages": MSG, "stream": True},
                      timeout=120) as s:
        assert s.status_code == 200 and any(line.startswith("data: ") for line in s.iter_lines())


def test_structured_output_and_seeds(server: LiveServer) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    body = {"model": "tiny", "messages": MSG, "max_tokens": 40, "temperature": 1.0, "seed": 7,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    one = _post(server, "/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
    two = _post(server, "/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
    assert one == two
    assert one.startswith("{")


def test_a_second_turn_is_served_from_a_state_snapshot(server: LiveServer) -> None:
    words = " ".join(f"w{i}" for i in range(60))
    msgs = [{"role": "user", "content": words}]
    first = _post(server, "/v1/chat/completions", {"model": "tiny", "messages": msgs, "max_tokens": 12,
                                                   "temperature": 0}).json()
    msgs += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
             {"role": "user", "content": "and then?"}]
    second = _post(server, "/v1/chat/completions", {"model": "tiny", "messages": msgs, "max_tokens": 4,
                                                    "temperature": 0}).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"] - 16


def test_the_playground_streams_and_explains_what_it_cannot_trace(server: LiveServer) -> None:
    with httpx.stream("POST", server.url + "/playground/api/generate", timeout=120,
                      json={"text": "hello", "params": {"max_tokens": 4}, "model": "tiny"}) as s:
        assert s.status_code < 500
        text = "".join(s.iter_lines())
    assert '"type": "step"' in text or '"type":"step"' in text
    models = httpx.get(server.url + "/playground/api/models", timeout=30).json()
    assert models[0]["layer_types"] and models[0]["state_bytes_per_sequence"] > 0
    r = httpx.post(server.url + "/playground/api/trace", json={"text": "hello", "model": "tiny"}, timeout=60)
    assert r.status_code == 400 and "hybrid" in r.text
