"""End to end: `hitenter serve` as a subprocess, and the real SmolLM2 chat model behind the openai client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from hitenter.testing.live_server import LiveServer, live_server
from hitenter.testing.serve import serve_subprocess

pytestmark = pytest.mark.slow     # a server subprocess and the real SmolLM2


@pytest.fixture()
def served_subprocess(tiny_llama_path: Path) -> Iterator[str]:
    args = ["--model", str(tiny_llama_path), "--api-key", "k-123", "--served-model-name", "tiny-sub",
            "--max-model-len", "128", "--max-queued-requests", "8"]
    with serve_subprocess(args, startup_s=90) as (url, _):
        yield url


def test_hitenter_serve_subprocess(served_subprocess: str) -> None:
    url = served_subprocess
    client = openai.OpenAI(base_url=url + "/v1", api_key="k-123", max_retries=0, timeout=60)
    # the playground's trigram toy model is served beside the main model by default; then the pulled
    # known models a request would load
    from hitenter.models.registry import KNOWN_MODELS

    ids = [m.id for m in client.models.list().data]
    assert ids[:2] == ["tiny-sub", "trigram"] and set(ids[2:]) <= set(KNOWN_MODELS), ids
    r = client.chat.completions.create(model="tiny-sub", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage is not None
    bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model="tiny-sub", prompt="hi " * 200, max_tokens=4)
    assert ei.value.body["n_ctx"] == 128  # type: ignore[index]
    assert httpx.get(url + "/metrics").status_code == 401        # behind the key by default
    auth = {"Authorization": "Bearer k-123"}
    assert "hitenter:request_success_total" in httpx.get(url + "/metrics", headers=auth).text


@pytest.fixture(scope="module")
def smol_server(smollm2_path: Path) -> Iterator[LiveServer]:
    from hitenter.engine.llm_engine import LLMEngine
    from hitenter.server.api import create_app

    engine = LLMEngine(str(smollm2_path), max_model_len=1024)
    with live_server(create_app(engine)) as srv:
        yield srv


def test_smollm2_chat(smol_server: LiveServer) -> None:
    client = openai.OpenAI(base_url=smol_server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    assert model == "smollm2-135m-instruct"
    msgs = [{"role": "system", "content": "You are a helpful assistant. Answer in a few words."},
            {"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=48)  # type: ignore[arg-type]
    text = r.choices[0].message.content or ""
    assert "Paris" in text, text
    assert "<|im_end|>" not in text and "<|im_start|>" not in text
    assert r.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=48,  # type: ignore[arg-type]
                                              stream=True, stream_options={"include_usage": True})
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage is not None and r.usage is not None
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    again = client.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=48)  # type: ignore[arg-type]
    assert again.choices[0].message.content == text
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens > 0
