"""The OpenAI API's request features on the tiny random Qwen2 model, in process: structured outputs, tool
calls, prompt logprobs, embeddings and the "nothing silently ignored" rules (real models and clients:
tests/server/openai/test_real_clients.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient

from hitenter.engine.llm_engine import LLMEngine
from hitenter.llm import LLM
from hitenter.sampling_params import SamplingParams, StructuredSpec
from hitenter.server.api import create_app
from hitenter.server.reply import parse_tool_calls
from hitenter.testing.json_schemas import random_schemas

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,6}$"},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}]
USER = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def engine(tools_engine: LLMEngine) -> LLMEngine:
    return tools_engine


@pytest.fixture(scope="module")
def client(engine: LLMEngine) -> Iterator[TestClient]:
    with TestClient(create_app(engine, served_model_name="tiny")) as c:
        yield c


def _ok(r: Any) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    return r.json()


def _err(r: Any, status: int, param: str | None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["param"] == param, err


def test_json_schema_requests_validate(tiny_qwen2_path: Path) -> None:
    """60 generated schemas sampled at temperature 1 in one mixed batch (plus unconstrained rows)."""
    llm = LLM(str(tiny_qwen2_path))
    schemas = random_schemas(60, seed=0, depth=1, ascii_strings=True)   # depth 2: tests/server/openai/test_real_clients.py (SmolLM2)
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=240, structured=StructuredSpec("json_schema", json.dumps(s)))
              for i, s in enumerate(schemas)] + [SamplingParams(temperature=1.0, seed=1, max_tokens=20)] * 4
    outs = llm.generate(["J"] * len(params), params)
    for s, out in zip(schemas, outs, strict=False):
        assert out.finish_reason == "stop", (s, out.text)
        jsonschema.validate(json.loads(out.text), s)
    alone = llm.generate(["J"], SamplingParams(temperature=1.0, seed=1, max_tokens=20))[0]
    for o in outs[len(schemas):]:   # unconstrained rows untouched by their constrained neighbours
        assert (o.token_ids, o.finish_reason) == (alone.token_ids, alone.finish_reason)


def test_response_format_and_guided_fields(client: TestClient) -> None:
    schema = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"], "additionalProperties": False}
    for body in ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}},
                 {"guided_json": schema}, {"structured_outputs": {"json": schema}}):
        r = _ok(client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 30, **body}))
        jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), schema)
    r = _ok(client.post("/v1/completions", json={"prompt": "a", "max_tokens": 5, "guided_choice": ["yes", "no"]}))
    assert r["choices"][0]["text"] in ("yes", "no")
    r = _ok(client.post("/v1/completions", json={"prompt": "a", "max_tokens": 9, "guided_regex": "[0-9]{3}-[a-c]{2}"}))
    assert len(r["choices"][0]["text"]) == 6 and r["choices"][0]["text"][3] == "-"
    r = _ok(client.post("/v1/completions", json={"prompt": "a", "max_tokens": 9, "guided_grammar": 'root ::= "ab" | "cd"'}))
    assert r["choices"][0]["text"] in ("ab", "cd")
    chunks = client.post("/v1/completions", json={"prompt": "a", "max_tokens": 5, "stream": True,
                                                  "guided_choice": ["alpha", "beta"]}).text
    text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in chunks.splitlines()
                   if line.startswith("data: {"))
    assert text in ("alpha", "beta")
    r = _ok(client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 40,
                                                      "response_format": {"type": "json_object"}}))
    assert r["choices"][0]["finish_reason"] == "length" or isinstance(json.loads(r["choices"][0]["message"]["content"]), dict)


def test_structured_errors(client: TestClient) -> None:
    _err(client.post("/v1/completions", json={"prompt": "a", "guided_regex": "("}), 400, "guided_regex")
    _err(client.post("/v1/completions", json={"prompt": "a", "guided_choice": []}), 400, "guided_choice")
    _err(client.post("/v1/completions", json={"prompt": "a", "response_format": {"type": "xml"}}), 400, "response_format")
    _err(client.post("/v1/completions", json={"prompt": "a", "guided_regex": "a", "guided_choice": ["b"]}), 400,
         "guided_choice")


def test_tool_choice_required_named_and_stream(client: TestClient) -> None:
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = _ok(client.post("/v1/chat/completions", json={"messages": USER, "tools": TOOLS, "tool_choice": choice,
                                                          "max_tokens": 150, "parallel_tool_calls": False}))
        ch = r["choices"][0]
        assert ch["finish_reason"] == "tool_calls", ch
        calls = ch["message"]["tool_calls"]
        assert len(calls) == 1 and calls[0]["type"] == "function"
        if isinstance(choice, dict):
            assert calls[0]["function"]["name"] == "get_weather"
            args = json.loads(calls[0]["function"]["arguments"])
            jsonschema.validate(args, TOOLS[0]["function"]["parameters"])
    text = client.post("/v1/chat/completions", json={"messages": USER, "tools": TOOLS, "stream": True, "max_tokens": 60,
                                                     "tool_choice": {"type": "function", "function": {"name": "noop"}}}).text
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    # the name in the call's first delta, its arguments as they are written (OpenAI's streaming form)
    assert [c["function"]["name"] for c in calls if "name" in c["function"]] == ["noop"]
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) is not None
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_errors(client: TestClient) -> None:
    _err(client.post("/v1/chat/completions", json={"messages": USER, "tools": TOOLS,
                                                   "tool_choice": {"type": "function", "function": {"name": "x"}}}),
         400, "tool_choice")
    _err(client.post("/v1/chat/completions", json={"messages": USER, "tool_choice": "required"}), 400, "tool_choice")


def test_template_without_tools_is_400(tiny_qwen2_path: Path) -> None:
    with TestClient(create_app(LLMEngine(str(tiny_qwen2_path)))) as c:
        _err(c.post("/v1/chat/completions", json={"messages": USER, "tools": TOOLS}), 400, "tools")


def test_parse_tool_calls() -> None:
    content, calls = parse_tool_calls('Sure.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n'
                                      '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>')
    assert content == "Sure." and [c["function"]["name"] for c in calls] == ["f", "g"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"x": 1}
    assert parse_tool_calls("plain text") == ("plain text", [])
    bare = '```json\n{"name": "f", "arguments": {"x": 2}}\n```'
    assert parse_tool_calls(bare, names={"f"})[1][0]["function"]["name"] == "f"
    assert parse_tool_calls(bare, names={"g"}) == (bare, [])


def test_echo_logprobs_equal_engine_logprobs(client: TestClient, tiny_qwen2_path: Path) -> None:
    llm = LLM(str(tiny_qwen2_path))
    prompt = llm.engine.tokenizer.encode("hello world")
    gen = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, logprobs=0))[0]
    own = [p.chosen.logprob for p in gen.logprobs or []]
    full = prompt + gen.token_ids
    for _ in range(2):      # the second time the prompt's prefix is cached: the same numbers
        sc = _ok(client.post("/v1/completions", json={"prompt": full, "max_tokens": 0, "echo": True,
                                                      "logprobs": 1}))["choices"][0]
        lp = sc["logprobs"]
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None and lp["text_offset"][0] == 0
        assert len(lp["tokens"]) == len(full)
        assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(lp["token_logprobs"][-len(own):], own, strict=True))
    both = _ok(client.post("/v1/completions", json={"prompt": "hello world", "max_tokens": 3, "echo": True,
                                                    "logprobs": 2, "temperature": 0, "prompt_logprobs": 1}))
    ch = both["choices"][0]
    assert len(ch["logprobs"]["tokens"]) == len(ch["prompt_logprobs"]) + 3 and ch["prompt_logprobs"][0] is None


def test_embeddings(client: TestClient) -> None:
    r = _ok(client.post("/v1/embeddings", json={"input": ["hello", "a longer input text"]}))
    vecs = [d["embedding"] for d in r["data"]]
    assert len(vecs) == 2 and len(vecs[0]) == len(vecs[1]) > 8
    assert all(math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-5) for v in vecs)
    one = _ok(client.post("/v1/embeddings", json={"input": "hello"}))["data"][0]["embedding"]
    assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(one, vecs[0], strict=True))
    _err(client.post("/v1/embeddings", json={"input": "x", "dimensions": 3}), 400, "dimensions")


def test_no_silent_ignores(client: TestClient) -> None:
    _err(client.post("/v1/completions", json={"prompt": "a", "frobnicate": 1}), 400, "frobnicate")
    _err(client.post("/v1/chat/completions", json={"messages": USER, "stream_options": {"include_usage": True}}),
         400, "stream_options")
    _err(client.post("/v1/completions", json={"prompt": "a", "suffix": "b"}), 400, "suffix")
    _err(client.post("/v1/chat/completions", json={"messages": USER, "continue_final_message": True}), 400,
         "continue_final_message")
    for method, path in (("post", "/v1/embeddingz"), ("get", "/v1/nope"), ("post", "/nope"), ("delete", "/v1/models")):
        r = getattr(client, method)(path)
        assert r.status_code in (404, 405) and r.json()["error"]["code"] == r.status_code, (path, r.text)
    assert client.post("/v1/nope").status_code == 404
    assert _ok(client.get("/v1/models/tiny"))["id"] == "tiny"
    _err(client.get("/v1/models/other"), 404, "model")
    info = _ok(client.get("/tokenizer_info"))
    assert info["eos_token"] and "chat_template" in info
    r = _ok(client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2}))
    assert "system_fingerprint" in r


def test_continue_final_message_and_chat_echo(client: TestClient, engine: LLMEngine) -> None:
    msgs = [*USER, {"role": "assistant", "content": "It is"}]
    body = {"messages": msgs, "max_tokens": 3, "temperature": 0, "continue_final_message": True,
            "add_generation_prompt": False}
    r = _ok(client.post("/v1/chat/completions", json=body))
    full = engine.tokenizer.apply_chat_template(msgs, add_generation_prompt=False)
    prefill = full[:full.rfind("It is") + len("It is")]
    direct = _ok(client.post("/v1/completions", json={"prompt": prefill, "max_tokens": 3, "temperature": 0}))
    assert r["choices"][0]["message"]["content"] == direct["choices"][0]["text"]
    echoed = _ok(client.post("/v1/chat/completions", json={**body, "echo": True}))
    assert echoed["choices"][0]["message"]["content"] == "It is" + direct["choices"][0]["text"]


def test_speculative_decoding_with_constrained_rows(tiny_qwen2_path: Path) -> None:
    """A constrained request speculates too (drafts checked against its grammar; more in
    tests/engine/speculative/test_structured.py) and obeys its grammar; it and its neighbour produce exactly their
    non-speculative tokens."""
    spec = LLM(str(tiny_qwen2_path), speculative_model=str(tiny_qwen2_path), num_speculative_tokens=3)
    plain = LLM(str(tiny_qwen2_path))
    schema = {"type": "object", "properties": {"k": {"enum": ["aa", "bb"]}, "n": {"type": "integer", "minimum": 0,
              "maximum": 99}}, "required": ["k", "n"], "additionalProperties": False}
    ps = [SamplingParams(temperature=0, max_tokens=40, structured=StructuredSpec("json_schema", json.dumps(schema))),
          SamplingParams(temperature=0, max_tokens=24)]
    a, b = spec.generate(["hello", "world"], ps), plain.generate(["hello", "world"], ps)
    jsonschema.validate(json.loads(a[0].text), schema)
    assert a[0].token_ids == b[0].token_ids and a[1].token_ids == b[1].token_ids
    assert spec.engine.spec_decode is not None and spec.engine.spec_decode.num_draft_tokens > 0
    assert a[0].extra["spec_decode"]["num_draft_tokens"] > 0


def test_out_of_vocab_ids_with_prompt_scoring_are_400(client: TestClient, engine: LLMEngine) -> None:
    """Prompt scoring runs the model before the engine sees the ids: an id past the vocabulary was a 500."""
    v = engine.model_config.vocab_size
    for extra in ({"prompt_logprobs": 0}, {"echo": True, "logprobs": 1}, {}):
        _err(client.post("/v1/completions", json={"prompt": [[v]], "max_tokens": 1, **extra}), 400, "prompt")


def test_best_of_and_continue_final_message_rules(client: TestClient) -> None:
    """The rules the OpenAPI schema states (allOf / if-then): best_of 1 with n 1 only; continuing the
    final message (of any role) needs add_generation_prompt false."""
    _ok(client.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, "best_of": 1}))
    for body in ({"n": 2, "best_of": 2}, {"n": 2, "best_of": 1}, {"best_of": 2}):
        _err(client.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, **body}), 400, "best_of")
    body = {"messages": USER, "max_tokens": 1, "continue_final_message": True, "add_generation_prompt": False}
    _ok(client.post("/v1/chat/completions", json=body))
    rule = client.app.openapi()["components"]["schemas"]["ChatCompletionRequest"]["allOf"][1]
    assert rule["if"]["properties"] == {"continue_final_message": {"const": True}}
