"""Requests as llama.cpp's and vLLM's own server tests send them, each sent the way the peer's test sent
it: strict numbers, unknown keys inside nested objects, ``json_object`` with a ``schema``,
``continuous_usage_stats``, CORS (``--allowed-origins``), JSON 404 for a base URL without /v1, extra
models named as written, and OpenAI's context-overflow wording. (The openai client's base64 embeddings:
tests/server/openai/test_openai_client.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app, model_name
from hitenter.testing.live_server import assert_error

USER = [{"role": "user", "content": "Hello"}]
ORIGIN = "http://localhost:3000"


@pytest.fixture(scope="module")
def client(engine: LLMEngine) -> Iterator[TestClient]:
    with TestClient(create_app(engine, served_model_name="tiny", allowed_origins=[ORIGIN])) as c:
        yield c


def _chat(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2, **body})


@pytest.mark.parametrize("field,value", [
    ("max_tokens", "2"), ("temperature", "0.5"), ("seed", "1"), ("n", "2"), ("max_tokens", 8.0), ("n", 2.0),
    ("seed", 1.0), ("top_k", 5.0), ("top_logprobs", 1.0), ("logit_bias", {"5": "1"}), ("stop_token_ids", [1.0]),
])
def test_numbers_are_strict(client: TestClient, field: str, value: Any) -> None:
    extra = {"logprobs": True} if field == "top_logprobs" else {}
    assert_error(_chat(client, **{field: value}, **extra), 400)


def test_an_integer_is_a_float(client: TestClient) -> None:
    assert _chat(client, temperature=1, top_p=1, max_tokens=1).status_code == 200


def test_strict_numbers_elsewhere(client: TestClient) -> None:
    assert_error(client.post("/v1/completions", json={"prompt": [1.0, 2.0], "max_tokens": 1}), 400)
    assert_error(client.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, "prompt_logprobs": 1.0}),
                 400, "prompt_logprobs")
    assert_error(client.post("/v1/embeddings", json={"input": [1.0]}), 400)
    r = client.post("/playground/api/burst", json={"model": "tiny", "n": 2.0})
    assert r.status_code == 400, r.text


@pytest.mark.parametrize("body,param", [
    ({"messages": [{"role": "user", "content": "hi", "mood": "x"}]}, "messages.0.mood"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "x": 1}]}]}, None),
    ({"stream": True, "stream_options": {"include_usage": True, "extra": 1}}, "stream_options.extra"),
    ({"tools": [{"type": "function", "function": {"name": "f", "paramz": {}}}]}, "tools.0.function.paramz"),
    ({"tools": [{"type": "function", "function": {"name": "f"}, "x": 1}]}, "tools.0.x"),
    ({"response_format": {"type": "json_object", "scheme": {}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "x": 1}}},
     "response_format.json_schema"),
    ({"messages": [*USER, {"role": "assistant", "content": None, "refusal": "no"}]}, "messages.1.refusal"),
])
def test_nested_unknown_keys_are_400(client: TestClient, body: dict[str, Any], param: str | None) -> None:
    e = assert_error(_chat(client, **body), 400)
    assert param is None or e["param"] == param, e


def test_messages_sent_back_by_the_openai_client_are_accepted(client: TestClient) -> None:
    """An assistant message as the openai client dumps it (refusal/annotations/audio null) is no unknown key."""
    back = {"role": "assistant", "content": "ok", "refusal": None, "annotations": None, "audio": None,
            "function_call": None, "tool_calls": None}
    r = _chat(client, messages=[*USER, back, {"role": "user", "content": "more"}])
    assert r.status_code == 200, r.text


def test_json_object_with_a_schema_is_constrained(client: TestClient) -> None:
    schema = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"],
              "additionalProperties": False}
    for seed in range(3):
        r = _chat(client, max_tokens=30, seed=seed, response_format={"type": "json_object", "schema": schema})
        assert r.status_code == 200, r.text
        jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), schema)


def test_continuous_usage_stats(client: TestClient) -> None:
    for path, body in (("/v1/chat/completions", {"messages": USER}), ("/v1/completions", {"prompt": "Hello"})):
        opts = {"include_usage": True, "continuous_usage_stats": True}
        r = client.post(path, json={**body, "max_tokens": 5, "temperature": 0, "stream": True,
                                    "stream_options": opts, "ignore_eos": True})
        chunks = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: {")]
        usages = [c["usage"] for c in chunks]
        assert all(u is not None for u in usages), chunks
        done = [u["completion_tokens"] for u in usages]
        assert done == sorted(done) and done[-1] == 5 and len({u["prompt_tokens"] for u in usages}) == 1
        assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in usages)


def test_cors(client: TestClient, engine: LLMEngine) -> None:
    pre = client.options("/v1/chat/completions", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in pre.headers["access-control-allow-methods"]
    r = client.get("/v1/models", headers={"Origin": ORIGIN})
    assert r.headers["access-control-allow-origin"] == ORIGIN
    r = client.get("/v1/nope", headers={"Origin": ORIGIN})           # errors carry them too
    assert r.status_code == 404 and r.headers["access-control-allow-origin"] == ORIGIN
    assert "access-control-allow-origin" not in client.get("/v1/models", headers={"Origin": "http://evil"}).headers
    with TestClient(create_app(engine, playground=False)) as plain:           # the default: no origin
        assert "access-control-allow-origin" not in plain.get("/v1/models", headers={"Origin": ORIGIN}).headers


def test_unknown_paths_are_json_404(client: TestClient) -> None:
    for method, path in (("POST", "/chat/completions"), ("POST", "/completions"), ("PUT", "/x/y"),
                         ("GET", "/chat/completions"), ("DELETE", "/nope")):
        assert_error(client.request(method, path, json={"messages": USER}), 404)
    r = client.post("/")                                                      # the page itself: 405
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"


def test_model_names() -> None:
    assert model_name("qwen2.5-coder-0.5b-instruct") == "qwen2.5-coder-0.5b-instruct"
    assert model_name("/m/tiny.v2.gguf") == "tiny.v2" and model_name("hf:o/r/Model-Q4_K_M.gguf") == "Model-Q4_K_M"
    assert model_name("trigram") == "trigram"


def test_overflow_wording(client: TestClient, engine: LLMEngine) -> None:
    n = engine.max_model_len
    e = assert_error(client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": n}), 400, "prompt")
    assert "maximum context length is" in e["message"] and e["n_ctx"] == n and e["n_prompt_tokens"] > 0
    e = assert_error(client.post("/v1/completions", json={"prompt": [5] * (n + 1), "max_tokens": 1}), 400, "prompt")
    assert "maximum context length is" in e["message"]
