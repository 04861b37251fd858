"""OpenAI chat and text completions as llama.cpp's and vLLM's own server tests check them, ported to hitenter
(tiny random Qwen2; a check on the model's own words becomes one on the structure): llama.cpp
tools/server/tests/unit/test_chat_completion.py and test_completion.py, and vLLM's
tests/entrypoints/openai/chat_completion validation tests. What each section leaves out, and why, is said
above it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.testing.live_server import LiveServer, live_server
from hitenter.testing.peer_conformance import MODEL, post

pytestmark = pytest.mark.slow      # a live server and many checks: the full suite's, not the fast lane's


@pytest.fixture(scope="module")
def server(tools_engine: LLMEngine) -> Iterator[LiveServer]:
    with live_server(create_app(tools_engine, MODEL, playground=False)) as srv:
        yield srv


@pytest.fixture(scope="module")
def oai(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(api_key="dummy", base_url=server.url + "/v1", max_retries=0, timeout=60)


# --- llama.cpp test_chat_completion.py -------------------------------------------------------------------
# Left out: its texts ("Suddenly", "Timmy": tinyllama2's words), system_fingerprint "b<build>" (null here, as
# OpenAI may send), the first chunk's content None (OpenAI's own first chunk carries ""), /apply-template,
# the __verbose prompt, timings_per_token / return_progress and the top-level json_schema / grammar fields
# (llama.cpp extensions: a 400 naming them here; vLLM's guided_json / guided_grammar are served), and
# two assistant turns in a row (a 400 there; OpenAI accepts them, so does the chat template here).

BOOK_CHAT = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]


def test_llama_chat_completion(server: LiveServer) -> None:
    r = post(server, "/v1/chat/completions", {"max_tokens": 8, "messages": BOOK_CHAT, "ignore_eos": True})
    b = r.json()
    n_prompt = len(post(server, "/tokenize", {"messages": BOOK_CHAT}).json()["tokens"])
    assert r.status_code == 200 and "cmpl" in b["id"] and b["usage"]["prompt_tokens"] == n_prompt
    assert b["usage"]["completion_tokens"] == 8 and b["choices"][0]["finish_reason"] == "length"
    assert b["choices"][0]["message"]["role"] == "assistant"
    parts = post(server, "/v1/chat/completions", {"max_tokens": 8, "ignore_eos": True, "messages": [
        BOOK_CHAT[0], {"role": "user", "content": [{"type": "text", "text": "What is"},
                                                   {"type": "text", "text": " the best book"}]}]}).json()
    assert parts["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"] or parts["usage"]


def test_llama_chat_completion_stream(server: LiveServer) -> None:
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60, json={
            "model": "test", "max_tokens": 8, "ignore_eos": True, "messages": BOOK_CHAT, "stream": True,
            "stream_options": {"include_usage": True}}) as r:
        chunks = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: ") and x != "data: [DONE]"]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert len({c["id"] for c in chunks}) == 1 and all(c["model"] == "test" for c in chunks)
    body = [c for c in chunks if c["choices"]]
    assert all("role" not in c["choices"][0]["delta"] for c in body[1:])
    assert [c["choices"][0]["finish_reason"] for c in body][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in body[:-1])
    usage = chunks[-1]["usage"]
    assert not chunks[-1]["choices"] and usage["completion_tokens"] == 8 and usage["prompt_tokens"] > 0


@pytest.mark.parametrize("fmt, pattern", [
    ({"type": "json_object", "schema": {"const": "42"}}, r'^"42"$'),
    ({"type": "json_object", "schema": {"type": "array", "items": {"type": "integer"}, "maxItems": 0}}, r"^\[ ?\]$"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"const": "foooooo"}}}, r'^"foooooo"$'),
    ({"type": "json_object"}, r"^\{"),
    ({"type": "sound"}, None), ({"type": "json_object", "schema": 123}, None),
    ({"type": "json_object", "schema": {"type": 123}}, None), ({"type": "json_object", "schema": {"type": "hiccup"}}, None),
])
def test_llama_chat_response_format(server: LiveServer, fmt: dict[str, Any], pattern: str | None) -> None:
    r = post(server, "/v1/chat/completions", {"max_tokens": 10, "response_format": fmt, "messages": [
        {"role": "system", "content": "You are a coding assistant."}, {"role": "user", "content": "Write an example"}]})
    if pattern is None:
        assert r.status_code == 400 and "error" in r.json(), r.text
    else:
        assert r.status_code == 200 and re.search(pattern, r.json()["choices"][0]["message"]["content"]), r.text


@pytest.mark.parametrize("messages", [None, "string", [123], [{}], [{"role": 123}], [{"role": "system", "content": 123}],
                                      [{"role": "system", "content": "test"}, {}]])
def test_llama_invalid_chat_completion_req(server: LiveServer, messages: Any) -> None:
    r = post(server, "/v1/chat/completions", {"messages": messages})
    assert r.status_code == 400 and "error" in r.json()


@pytest.mark.parametrize("extra", [{"json_schema": {"const": "42"}}, {"grammar": 'root ::= "a"'},
                                   {"timings_per_token": True}, {"return_progress": True}])
def test_llama_extensions_are_named_refusals(server: LiveServer, extra: dict[str, Any]) -> None:
    r = post(server, "/v1/chat/completions", {"messages": BOOK_CHAT, "max_tokens": 2, **extra})
    assert r.status_code == 400 and next(iter(extra)) in r.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_llama_logprobs(oai: openai.OpenAI, stream: bool) -> None:
    kw: dict[str, Any] = {"model": "test", "temperature": 0.0, "messages": BOOK_CHAT, "max_tokens": 5,
                          "logprobs": True, "top_logprobs": 10}
    if not stream:
        r = oai.chat.completions.create(**kw)
        text, tokens = r.choices[0].message.content, r.choices[0].logprobs.content   # type: ignore[union-attr]
    else:
        text, tokens = "", []
        for c in oai.chat.completions.create(**kw, stream=True):
            if c.choices and c.choices[0].logprobs is not None:
                tokens += c.choices[0].logprobs.content or []
            if c.choices:
                text += c.choices[0].delta.content or ""
    assert tokens and "".join(t.token for t in tokens) == text
    assert all(t.logprob <= 0.0 and t.bytes is not None and len(t.top_logprobs) == 10 for t in tokens)


def test_llama_logit_bias(server: LiveServer, oai: openai.OpenAI) -> None:
    """llama.cpp bans the words its model would say; on a random model the checkable form is the other sign:
    +100 on one token makes greedy decoding choose it every time, -100 on it then never."""
    tid = post(server, "/tokenize", {"prompt": "a", "add_special_tokens": False}).json()["tokens"][0]
    forced = oai.chat.completions.create(model="test", temperature=0, messages=BOOK_CHAT, max_tokens=4,  # type: ignore[arg-type]
                                         logit_bias={str(tid): 100})
    assert forced.choices[0].message.content == "a" * 4
    free = oai.chat.completions.create(model="test", temperature=0, messages=BOOK_CHAT, max_tokens=8)  # type: ignore[arg-type]
    first = post(server, "/tokenize", {"prompt": free.choices[0].message.content or "", "add_special_tokens": False})
    banned = oai.chat.completions.create(model="test", temperature=0, messages=BOOK_CHAT, max_tokens=8,  # type: ignore[arg-type]
                                         logit_bias={str(first.json()["tokens"][0]): -100})
    assert banned.choices[0].message.content != free.choices[0].message.content


@pytest.mark.parametrize("stream", [False, True])
def test_llama_context_size_exceeded(server: LiveServer, stream: bool) -> None:
    r = post(server, "/v1/chat/completions", {"messages": BOOK_CHAT * 400, "stream": stream})
    err = r.json()["error"]
    n_ctx = httpx.get(server.url + "/v1/models").json()["data"][0]["max_model_len"]
    assert r.status_code == 400 and "maximum context length" in err["message"]
    assert err["n_prompt_tokens"] > n_ctx and err["n_ctx"] == n_ctx        # llama.cpp's fields (its type is its own)


def test_llama_multiple_choices(server: LiveServer) -> None:
    b = post(server, "/v1/chat/completions", {"max_tokens": 8, "n": 2, "ignore_eos": True, "messages": BOOK_CHAT}).json()
    assert len(b["choices"]) == 2 and all(c["message"]["role"] == "assistant" and c["finish_reason"] == "length"
                                          for c in b["choices"])


# --- llama.cpp test_completion.py (its /v1/completions checks; /completion, /slots, n_probs,
# response_fields, return_tokens and cache_prompt are llama.cpp's own endpoint and fields) ------------------

LIFE = "I believe the meaning of life is"


def test_llama_completion_with_openai_library(oai: openai.OpenAI) -> None:
    r = oai.completions.create(model="test", prompt=LIFE, max_tokens=8, temperature=0,
                               extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.choices[0].text
    streamed = "".join(c.choices[0].text for c in oai.completions.create(
        model="test", prompt=LIFE, max_tokens=8, temperature=0, stream=True, extra_body={"ignore_eos": True})
        if c.choices)
    assert streamed == r.choices[0].text                                   # stream vs non-stream


def test_llama_seeds(server: LiveServer) -> None:
    def text(seed: int) -> str:
        return post(server, "/v1/completions", {"prompt": LIFE, "seed": seed, "temperature": 1.0, "max_tokens": 12,
                                                "ignore_eos": True}).json()["choices"][0]["text"]
    same = {text(42) for _ in range(3)}
    assert len(same) == 1 and len({text(s) for s in range(4)}) == 4


def test_llama_completion_with_tokens_input(server: LiveServer) -> None:
    tokens = post(server, "/tokenize", {"prompt": LIFE}).json()["tokens"]
    greedy = {"temperature": 0, "max_tokens": 6}
    one = post(server, "/v1/completions", {"prompt": tokens, **greedy}).json()["choices"]
    two = post(server, "/v1/completions", {"prompt": [tokens, tokens], **greedy}).json()["choices"]
    mixed = post(server, "/v1/completions", {"prompt": [LIFE, LIFE], **greedy}).json()["choices"]
    assert one[0]["text"] == two[0]["text"] == two[1]["text"] == mixed[0]["text"]


def test_llama_parallel_requests(server: LiveServer) -> None:
    import concurrent.futures

    bodies = [{"prompt": p, "seed": 42, "temperature": 1.0, "max_tokens": 12, "ignore_eos": True}
              for p in ("Write a very long book.", "Write another a poem.", "What is LLM?", "The sky is blue.")]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda b: post(server, "/v1/completions", b).json()["choices"][0]["text"], bodies))
    alone = [post(server, "/v1/completions", b).json()["choices"][0]["text"] for b in bodies]
    assert together == alone and all(len(t) > 0 for t in together)       # batching changes no seeded result


# --- vLLM tests/entrypoints/openai/chat_completion: test_non_object_body_validation, test_tool_choice_null,
# test_chat_stop_token_ids_validation, test_chat_logit_bias_validation, test_system_fingerprint_none
# (vLLM's cache_salt is its own field: a 400 naming it here) ---------------------------------------------

HELLO = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("raw", [b"this is not valid json{{{", b'["not", "an", "object"]', b"42", b"null"])
def test_vllm_non_object_body(server: LiveServer, raw: bytes) -> None:
    r = httpx.post(server.url + "/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "error" in r.json(), r.text


def test_vllm_tool_choice_null(server: LiveServer) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]
    base = {"messages": HELLO, "max_tokens": 2, "temperature": 0}
    assert post(server, "/v1/chat/completions", {**base, "tools": tools, "tool_choice": None}).json()["choices"] == \
        post(server, "/v1/chat/completions", {**base, "tools": tools}).json()["choices"]
    assert post(server, "/v1/chat/completions", {**base, "tool_choice": None}).status_code == 200
    r = post(server, "/v1/chat/completions", {**base, "tool_choice": None,
                                              "structured_outputs": {"json": {"type": "object"}}, "max_tokens": 20})
    assert r.status_code == 200, r.text
    assert post(server, "/v1/chat/completions", {**base, "tools": tools, "tool_choice": "bogus"}).status_code == 400
    assert post(server, "/v1/chat/completions", {**base, "tool_choice": "auto"}).status_code == 400
    assert post(server, "/v1/chat/completions", {**base, "tools": tools, "tool_choice": "none"}).status_code == 200


def _vocab(server: LiveServer) -> int:
    return int(httpx.get(server.url + "/tokenizer_info").json()["vocab_size"])


def test_vllm_stop_token_ids_and_logit_bias_bounds(server: LiveServer) -> None:
    v, base = _vocab(server), {"messages": HELLO, "max_tokens": 3}
    assert post(server, "/v1/chat/completions", {**base, "stop_token_ids": [v - 1]}).status_code == 200
    assert post(server, "/v1/chat/completions", {**base, "logit_bias": {str(v - 1): 1.0}}).status_code == 200
    for body in ({"stop_token_ids": [v + 1]}, {"logit_bias": {str(v + 1): 1.0}}):
        r = post(server, "/v1/chat/completions", {**base, **body})
        msg = r.json()["error"]["message"]
        assert r.status_code == 400 and str(v + 1) in msg and (str(v) in msg or str(v - 1) in msg), msg
    assert post(server, "/v1/chat/completions", {**base, "stop_token_ids": [-1]}).status_code == 400


@pytest.mark.parametrize("bias, names", [({"not_a_token_id": 50}, ["not_a_token_id", "logit_bias"]),
                                         ({"1": "not_a_number"}, ["logit_bias"]),
                                         ({"bad1": 50.0, "bad2": 20.0}, ["bad1", "bad2"])])
def test_vllm_logit_bias_keys_and_values(server: LiveServer, bias: dict[str, Any], names: list[str]) -> None:
    r = post(server, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 3, "logit_bias": bias})
    assert r.status_code == 400 and all(n in r.text for n in names), r.text


def test_vllm_system_fingerprint_none_and_cache_salt(server: LiveServer) -> None:
    b = post(server, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 2}).json()
    assert "system_fingerprint" in b and b["system_fingerprint"] is None
    r = post(server, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 2, "cache_salt": ""})
    assert r.status_code == 400 and "cache_salt" in r.json()["error"]["message"]
