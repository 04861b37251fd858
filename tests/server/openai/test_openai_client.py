"""The official openai client against a live server (tiny random Llama) on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.testing.live_server import LiveServer, live_server, wait_until

MODEL = "tiny"
CHAT = [{"role": "user", "content": "Hello world"}]


@pytest.fixture(scope="module")
def server(engine: LLMEngine) -> Iterator[LiveServer]:
    with live_server(create_app(engine, served_model_name=MODEL)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics").text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _m(snap: dict[Any, float], name: str, **labels: str) -> float:
    key = (name, tuple(sorted({"model_name": MODEL, **labels}.items())))
    return snap.get(key, 0.0)


def test_models_and_health(client: openai.OpenAI, server: LiveServer) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.url + "/health").status_code == 200


def test_chat_stream_matches_non_stream(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == MODEL
    c = r.choices[0]
    assert c.message.role == "assistant" and c.finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0,  # type: ignore[arg-type]
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == c.message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8 and chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_chat_content_parts_and_default_max_tokens(client: openai.OpenAI, engine: LLMEngine) -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "world"}]}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=4)  # type: ignore[arg-type]
    r2 = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=4)  # type: ignore[arg-type]
    assert r.choices[0].message.content == r2.choices[0].message.content
    # chat without max_tokens may use the rest of the window (ignore_eos: the tiny model never stops)
    r3 = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0,  # type: ignore[arg-type]
                                        extra_body={"ignore_eos": True})
    assert r3.usage is not None and r3.usage.total_tokens == engine.max_model_len
    assert r3.choices[0].finish_reason == "length"


def test_completions_shapes(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="Hello", temperature=0)
    assert r.id.startswith("cmpl-") and r.object == "text_completion"
    assert r.usage is not None and r.usage.completion_tokens == 16            # legacy default max_tokens
    batch = client.completions.create(model=MODEL, prompt=["Hello", "abc"], max_tokens=3, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == client.completions.create(model=MODEL, prompt="Hello", max_tokens=3,
                                                              temperature=0).choices[0].text
    ids = client.completions.create(model=MODEL, prompt=[[72, 101], [97, 98]], max_tokens=2, temperature=0)
    assert len(ids.choices) == 2 and ids.usage is not None and ids.usage.prompt_tokens == 4
    one = client.completions.create(model=MODEL, prompt=[72, 101], max_tokens=2, temperature=0)
    assert one.choices[0].text == ids.choices[0].text
    plain = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0)
    echo = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0, echo=True)
    assert echo.choices[0].text == "Hello" + plain.choices[0].text


def test_completions_stream_and_n(client: openai.OpenAI) -> None:
    full = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=5, n=3, temperature=1.5, seed=7)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage is not None and r.usage.completion_tokens == 15
    texts: dict[int, str] = {0: "", 1: "", 2: ""}
    finished: list[int] = []
    for ch in client.completions.create(model=MODEL, prompt="Hello", max_tokens=5, n=3, temperature=1.5, seed=7,
                                        stream=True):
        for c in ch.choices:
            texts[c.index] += c.text
            if c.finish_reason:
                finished.append(c.index)
    assert sorted(finished) == [0, 1, 2]
    assert texts == {c.index: c.text for c in r.choices}      # same seed: same n completions, streamed or not
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, n=2)  # type: ignore[arg-type]
    assert [c.index for c in chat.choices] == [0, 1]


def test_seed_reproducible(client: openai.OpenAI) -> None:
    def run(seed: int) -> str:
        r = client.completions.create(model=MODEL, prompt="the cat", max_tokens=10, temperature=2.0, seed=seed,
                                      logprobs=0)
        assert r.choices[0].logprobs is not None
        return repr(r.choices[0].logprobs.tokens)

    assert run(1234) == run(1234)
    assert len({run(s) for s in range(6)}) >= 2


def test_stop_strings(client: openai.OpenAI) -> None:
    base = client.completions.create(model=MODEL, prompt="Hello", max_tokens=12, temperature=0).choices[0].text
    stop = base[2:7]
    cut = base[:base.index(stop)]
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=12, temperature=0, stop=[stop])
    c = r.choices[0]
    assert c.text == cut and c.finish_reason == "stop" and c.stop_reason == stop
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=12, temperature=0, stop=stop, stream=True) if ch.choices)
    assert streamed == cut
    inc = client.completions.create(model=MODEL, prompt="Hello", max_tokens=12, temperature=0, stop=[stop],
                                    extra_body={"include_stop_str_in_output": True})
    assert inc.choices[0].text == cut + stop


def test_logprobs_shapes(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == 4 and "".join(lp.tokens) == r.choices[0].text
    assert lp.top_logprobs is not None and all(2 <= len(t) <= 3 for t in lp.top_logprobs)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]
    assert all(v <= 0 for v in lp.token_logprobs)
    c = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, temperature=0,  # type: ignore[arg-type]
                                       logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 3
    for e in content:
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert e.bytes and bytes(e.bytes).decode("utf-8", "replace") == e.token
    stream = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, temperature=0,  # type: ignore[arg-type]
                                                 logprobs=True, top_logprobs=2, stream=True))
    got = [e.token for ch in stream if ch.choices and ch.choices[0].logprobs
           for e in ch.choices[0].logprobs.content or []]
    assert got == [e.token for e in content]


def test_cached_tokens_on_repeated_prompt(client: openai.OpenAI) -> None:
    prompt = "the cat is on the mat and the dog is in the house, " * 4          # several KV blocks
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    assert again.choices[0].text == first.choices[0].text
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    u = chunks[-1].usage
    assert u is not None and u.prompt_tokens_details is not None and u.prompt_tokens_details.cached_tokens > 0


def test_tokenize_detokenize(server: LiveServer, engine: LLMEngine) -> None:
    r = httpx.post(server.url + "/tokenize", json={"prompt": "Hello world"}).json()
    assert r["tokens"] == engine.tokenizer.encode("Hello world") and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == engine.max_model_len
    m = httpx.post(server.url + "/tokenize", json={"messages": CHAT}).json()
    assert m["tokens"] == engine.tokenizer.encode(engine.tokenizer.apply_chat_template(CHAT))
    d = httpx.post(server.url + "/detokenize", json={"tokens": r["tokens"]}).json()
    assert d == {"prompt": "Hello world"}


def test_metrics_count_requests(client: openai.OpenAI, server: LiveServer, engine: LLMEngine) -> None:
    before = _metrics(server.url)
    usage = []
    for i in range(3):
        r = client.completions.create(model=MODEL, prompt=f"metrics {i}", max_tokens=4, temperature=0)
        usage.append(r.usage)
    r2 = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, temperature=0, stop="x" * 50)  # type: ignore[arg-type]
    usage.append(r2.usage)
    after = _metrics(server.url)

    def d(name: str, **labels: str) -> float:
        return _m(after, name, **labels) - _m(before, name, **labels)

    assert d("hitenter:request_success_total", finished_reason="length") == 4
    assert d("hitenter:prompt_tokens_total") == sum(u.prompt_tokens for u in usage)
    assert d("hitenter:generation_tokens_total") == sum(u.completion_tokens for u in usage)
    assert d("hitenter:time_to_first_token_seconds_count") == 4
    assert d("hitenter:e2e_request_latency_seconds_count") == 4
    assert d("hitenter:request_queue_time_seconds_count") == 4
    assert d("hitenter:inter_token_latency_seconds_count") == 3 * 3 + 1
    assert d("hitenter:aborted_requests_total") == 0
    assert wait_until(lambda: _m(_metrics(server.url), "hitenter:num_requests_running") == 0)
    snap = _metrics(server.url)
    assert _m(snap, "hitenter:num_requests_waiting") == 0 and _m(snap, "hitenter:kv_cache_usage_perc") >= 0
    assert ("hitenter:num_preemptions_total", (("model_name", MODEL),)) in snap
    assert ("hitenter:cached_prompt_tokens_total", (("model_name", MODEL),)) in snap


def test_extra_models_are_routed_by_name(tiny_llama_path: Path) -> None:
    from fastapi.testclient import TestClient

    main, tri = LLMEngine(str(tiny_llama_path)), LLMEngine("trigram")
    with TestClient(create_app(main, served_model_name="tiny", extra_engines={"trigram": tri})) as c:
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["tiny", "trigram"]
        for name in ("tiny", "trigram"):
            r = c.post("/v1/completions", json={"model": name, "prompt": "the deploy", "max_tokens": 3}).json()
            assert r["model"] == name and r["choices"][0]["finish_reason"] in ("stop", "length")
        text = c.get("/metrics").text
        assert 'hitenter:request_success_total{finished_reason="length",model_name="tiny"} 1.0' in text
        assert 'model_name="trigram"' in text


def test_embeddings_with_the_openai_client(client: openai.OpenAI, server: LiveServer) -> None:
    """The client asks for base64 by default and decodes it: the same vector as encoding_format float."""
    r = client.embeddings.create(model=MODEL, input=["Hello world", "abc"])
    floats = httpx.post(server.url + "/v1/embeddings", json={"input": "Hello world"}).json()["data"][0]["embedding"]
    assert len(r.data) == 2 and r.data[0].embedding == pytest.approx(floats, abs=1e-6)
    assert abs(sum(x * x for x in r.data[1].embedding) - 1) < 1e-4
    f = client.embeddings.create(model=MODEL, input="Hello world", encoding_format="float")
    assert f.data[0].embedding == pytest.approx(floats, abs=1e-6)
