"""Fuzz the request schemas (hypothesis): no malformed input may give a 5xx; 4xx bodies keep the error shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app

FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

weird = st.text(st.characters(exclude_categories=()), max_size=6)          # lone surrogates, controls
scalar = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
          | st.text(max_size=12) | weird)
anything = st.recursive(scalar, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                        max_leaves=8)
small_int = st.integers(-2, 12) | st.sampled_from([10**9, 2**64, -(2**63) - 1])
unit = st.floats(0, 1) | st.sampled_from([-0.5, 1.5, float("nan"), float("inf")])
token_ids = st.lists(st.integers(-5, 400), max_size=6)
text = st.text(max_size=24) | weird
# plausible values (valid most of the time, sometimes just out of range)
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(["tiny", "tiny", "other", ""]) | weird, "n": st.integers(0, 3) | st.just(10**12),
    "temperature": st.floats(0, 2) | st.sampled_from([-1.0, 2.5, float("nan")]), "top_p": unit,
    "top_k": st.integers(-2, 50), "min_p": unit, "presence_penalty": st.floats(-2.5, 2.5),
    "frequency_penalty": st.floats(-2.5, 2.5), "repetition_penalty": st.floats(-0.5, 3),
    "logit_bias": st.dictionaries(st.integers(-5, 330).map(str) | st.text(max_size=3), st.floats(-150, 150),
                                  max_size=3),
    "seed": small_int, "stop": text | st.lists(st.text(max_size=4), max_size=3), "stop_token_ids": token_ids,
    "max_tokens": small_int | st.none(), "min_tokens": st.integers(-1, 6), "ignore_eos": st.booleans(),
    "include_stop_str_in_output": st.booleans(), "skip_special_tokens": st.booleans(), "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}) | st.none(),
    "user": text,
}
prompt = text | token_ids | st.lists(st.text(max_size=8), max_size=3) | st.lists(token_ids, max_size=3)
part = st.fixed_dictionaries({"type": st.sampled_from(["text", "text", "image_url"]), "text": st.text(max_size=8)})
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "x"]),
                                 "content": text | st.lists(part, max_size=2) | st.none()})
messages = st.lists(message, max_size=3)


def _bodies(required: dict[str, st.SearchStrategy[Any]], extra: dict[str, st.SearchStrategy[Any]]) -> Any:
    fields = {**PLAUSIBLE, **extra}
    plausible = st.fixed_dictionaries(required, optional=fields)
    # the same with one or two fields (or a required one) replaced by arbitrary JSON, or unknown fields
    wild = st.builds(lambda base, junk: {**base, **junk}, plausible,
                     st.dictionaries(st.sampled_from(sorted({*fields, *required, "junk"})), anything,
                                     min_size=1, max_size=2))
    return st.one_of(plausible, plausible, wild, anything)


completion_bodies = _bodies({"prompt": prompt}, {"logprobs": st.integers(-1, 6) | st.none(), "echo": st.booleans(),
                                                 "suffix": st.none() | st.text(max_size=3),
                                                 "best_of": st.none() | st.integers(0, 3)})
chat_bodies = _bodies({"messages": messages}, {"logprobs": st.booleans(), "top_logprobs": st.integers(-1, 25),
                                              "max_completion_tokens": small_int})


@pytest.fixture(scope="module")
def client(tiny_llama_path: Path) -> Iterator[TestClient]:
    engine = LLMEngine(str(tiny_llama_path), max_model_len=32)        # keeps any valid request short
    with TestClient(create_app(engine, served_model_name="tiny"), raise_server_exceptions=False) as c:
        yield c


def _check(c: TestClient, path: str, body: Any) -> None:
    raw = json.dumps(body, allow_nan=True)
    r = c.post(path, content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (body, r.status_code, r.text)     # unsupported values are 400s, never 5xx
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["code"] == r.status_code and isinstance(err["message"], str), r.text
        return
    if r.headers["content-type"].startswith("text/event-stream"):
        events = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]" and not any('"error"' in e[:10] for e in events), (body, r.text[-500:])
    else:
        assert r.json()["choices"], r.text


@FUZZ
@given(body=completion_bodies)
def test_fuzz_completions(client: TestClient, body: Any) -> None:
    _check(client, "/v1/completions", body)


@pytest.mark.slow
@FUZZ
@given(body=chat_bodies)
def test_fuzz_chat(client: TestClient, body: Any) -> None:
    _check(client, "/v1/chat/completions", body)


@FUZZ
@given(path=st.sampled_from(["/tokenize", "/detokenize"]),
       body=st.fixed_dictionaries({}, optional={"prompt": prompt, "messages": messages, "tokens": token_ids | anything,
                                                "model": anything}) | anything)
@pytest.mark.slow
def test_fuzz_tokenize(client: TestClient, path: str, body: Any) -> None:
    _check_tok(client, path, body)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@pytest.mark.slow
@given(raw=st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_fuzz_raw_bytes(client: TestClient, raw: bytes) -> None:
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize"):
        r = client.post(path, content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 or r.status_code == 200, (raw, r.text)


def _check_tok(c: TestClient, path: str, body: Any) -> None:
    r = c.post(path, content=json.dumps(body, allow_nan=True), headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (body, r.text)
    if r.status_code >= 400:
        assert r.json()["error"]["code"] == r.status_code
