"""Images on /v1/chat/completions (OpenAI image_url, the official openai client) for a Gemma 4 model (tiny
random gemma4 + its tiny gemma4v mmproj found beside it): an answer streamed and not, the prompt holding the
image's rows (at least 70: Gemma 4's minimum), and the same image again served by the prefix cache without
the encoder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.testing.live_server import live_server
from hitenter.testing.tiny_vision import data_url, sample_image

MODEL = "tiny-gemma4-vision"
pytestmark = pytest.mark.slow


def _chat(url: str, text: str = "What is in this picture?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> LLMEngine:
    from hitenter.testing.tiny_families import write_tiny_family
    from hitenter.testing.tiny_gemma4v import write_tiny_gemma4v_mmproj

    d: Path = tmp_path_factory.mktemp("gemma4_vision")
    write_tiny_gemma4v_mmproj(d / "mmproj-tiny-gemma4.gguf", seed=0)
    return LLMEngine(str(write_tiny_family(d / "tiny-gemma4.gguf", "gemma4", seed=0)))


@pytest.fixture(scope="module")
def client(engine: LLMEngine) -> Iterator[openai.OpenAI]:
    with live_server(create_app(engine, served_model_name=MODEL)) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_image_answered_streamed_and_not(client: openai.OpenAI, engine: LLMEngine) -> None:
    assert engine.vision is not None and engine.vision.encoder.image_begin == "<|image>"
    msgs = _chat(data_url(sample_image(40, 56, 11)))
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0)  # type: ignore[arg-type]
    assert r.choices[0].finish_reason == "length" and r.usage is not None and r.usage.completion_tokens == 6
    text_only = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is in this picture?"}],
                                               max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens >= text_only.usage.prompt_tokens + 70   # type: ignore[union-attr]
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0,  # type: ignore[arg-type]
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content


def test_same_image_again_hits_the_prefix_cache_without_the_encoder(client: openai.OpenAI, engine: LLMEngine) -> None:
    msgs = _chat(data_url(sample_image(64, 30, 12)), "Describe it")
    before = engine.vision.runs
    first = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0)  # type: ignore[arg-type]
    runs = engine.vision.runs
    assert runs == before + 1
    again = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0)  # type: ignore[arg-type]
    assert engine.vision.runs == runs
    cached = again.usage.prompt_tokens_details.cached_tokens    # type: ignore[union-attr]
    assert cached >= 70 and again.choices[0].message.content == first.choices[0].message.content
