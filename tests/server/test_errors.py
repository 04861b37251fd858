"""Every error status with vLLM's body shape {"error": {message, type, param, code}}."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.testing.live_server import LiveServer, assert_error, live_server, wait_until

KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(engine: LLMEngine) -> Iterator[LiveServer]:
    with live_server(create_app(engine, served_model_name="tiny", api_key=KEY)) as srv:
        yield srv


_err = assert_error


def _post(srv: LiveServer, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, headers=AUTH if headers is None else headers, timeout=60)


def test_401_without_or_with_wrong_key(server: LiveServer) -> None:
    body = {"prompt": "hi", "max_tokens": 1}
    assert _err(_post(server, "/v1/completions", body, {}), 401)["type"] == "AuthenticationError"
    _err(_post(server, "/v1/completions", body, {"Authorization": "Bearer nope"}), 401)
    _err(httpx.get(server.url + "/v1/models"), 401)
    assert _post(server, "/v1/completions", body).status_code == 200
    assert httpx.get(server.url + "/health").status_code == 200         # open
    _err(httpx.get(server.url + "/metrics"), 401)                       # behind the key unless --metrics-public
    assert httpx.get(server.url + "/metrics", headers=AUTH).status_code == 200


def test_404_unknown_model(server: LiveServer) -> None:
    e = _err(_post(server, "/v1/chat/completions", {"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}),
             404, "model")
    assert e["type"] == "NotFoundError" and "gpt-9" in e["message"]
    _err(httpx.get(server.url + "/nowhere"), 404)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "hi", "temperature": 3}, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, "top_p"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, "n"),
    ("/v1/completions", {"prompt": "hi", "n": 100000}, "n"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 50}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"999999": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "presence_penalty": 9}, "presence_penalty"),
    ("/v1/completions", {"prompt": "hi", "stop": [""]}, "stop"),
    ("/v1/completions", {"prompt": [-1, 5]}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "temperature": "warm"}, "temperature"),    # pydantic: 400, not 422
    ("/v1/completions", {"temperature": 0.5}, "prompt"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 99},
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
     "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
])
def test_400_names_the_parameter(server: LiveServer, path: str, body: dict[str, Any], param: str) -> None:
    e = _err(_post(server, path, body), 400)
    assert e["type"] == "BadRequestError"
    assert e["param"] == param or (e["param"] or "").startswith(param + "."), e


def test_400_malformed_json(server: LiveServer) -> None:
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", timeout=10,
                   headers={**AUTH, "Content-Type": "application/json"})
    _err(r, 400)


def test_400_context_overflow(server: LiveServer, engine: LLMEngine) -> None:
    n_ctx = engine.max_model_len
    long = "Hello " * (n_ctx + 10)
    n_prompt = len(engine.tokenizer.encode(long))
    e = _err(_post(server, "/v1/completions", {"prompt": long, "max_tokens": 4}), 400, "prompt")
    assert e["n_prompt_tokens"] == n_prompt and e["n_ctx"] == n_ctx
    e = _err(_post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": long}]}), 400, "messages")
    assert e["n_ctx"] == n_ctx and e["n_prompt_tokens"] > n_ctx
    # fits alone, but not with max_tokens: still 400, never truncated
    e = _err(_post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": n_ctx}), 400)
    assert e["n_ctx"] == n_ctx


@pytest.mark.slow
def test_429_when_queue_full(tiny_llama_path: Path) -> None:
    busy = LLMEngine(str(tiny_llama_path), max_num_seqs=1)
    real_step = busy.step

    def slow_step():  # the tiny model could finish 200 tokens before the second request is queued
        time.sleep(0.01)
        return real_step()

    busy.step = slow_step  # type: ignore[method-assign]
    with live_server(create_app(busy, max_queued_requests=1)) as srv:
        body = {"prompt": "Hello", "max_tokens": 200, "ignore_eos": True, "temperature": 0}
        first = httpx.Client(timeout=60)
        results: list[int] = []
        t1 = threading.Thread(target=lambda: results.append(first.post(srv.url + "/v1/completions", json=body).status_code))
        t1.start()
        assert wait_until(lambda: busy.scheduler.num_running == 1, 10)
        t2 = threading.Thread(target=lambda: results.append(httpx.post(srv.url + "/v1/completions", json=body,
                                                                       timeout=60).status_code))
        t2.start()
        assert wait_until(lambda: busy.scheduler.num_waiting == 1, 10)
        e = _err(httpx.post(srv.url + "/v1/completions", json=body, timeout=10), 429)
        assert e["type"] == "RateLimitError"
        t1.join(60)
        t2.join(60)
        assert results == [200, 200]


def test_mid_stream_error_event_and_500(server: LiveServer, engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    real_step = engine.step
    calls = {"n": 0}

    def flaky_step() -> Any:
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("injected failure")
        return real_step()

    monkeypatch.setattr(engine, "step", flaky_step)
    body = {"prompt": "Hello", "max_tokens": 20, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=AUTH, timeout=60) as r:
        assert r.status_code == 200
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["code"] == 500 and "injected failure" in err["message"]
    assert all("choices" in json.loads(e) for e in events[:-2])
    calls["n"] = 0
    _err(_post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 20}), 500)
    monkeypatch.setattr(engine, "step", real_step)
    assert wait_until(lambda: engine.kv_manager.num_free_blocks == engine.parts.num_blocks)
    assert _post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 3}).status_code == 200
    assert httpx.get(server.url + "/health").status_code == 200
