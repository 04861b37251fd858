"""Images on /v1/chat/completions with the official openai client (tiny random Gemma 3 + its mmproj): an
answer streamed and not, the same image again served by the prefix cache without the encoder (its run
counter), every bad image a 400 naming where it is, and a model without a vision encoder a 400 naming
--mmproj."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.server.image_chat import MAX_IMAGES
from hitenter.testing.live_server import LiveServer, assert_error, live_server
from hitenter.testing.tiny_vision import bad_images, data_url, sample_image

MODEL = "tiny-vision"
IMAGE = data_url(sample_image(48, 40, 1))


def _chat(url: str, text: str = "What is in this picture?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


@pytest.fixture(scope="module")
def server(vision_engine: LLMEngine) -> Iterator[LiveServer]:
    with live_server(create_app(vision_engine, served_model_name=MODEL)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_image_answered_streamed_and_not(client: openai.OpenAI, vision_engine: LLMEngine) -> None:
    msgs = _chat(data_url(sample_image(40, 56, 11)))
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0)  # type: ignore[arg-type]
    assert r.choices[0].finish_reason == "length" and r.usage is not None and r.usage.completion_tokens == 6
    # the prompt holds the image's rows (16 on the tiny mmproj) beside the text
    text_only = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is in this picture?"}],
                                               max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens >= text_only.usage.prompt_tokens + 16   # type: ignore[union-attr]
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0,  # type: ignore[arg-type]
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content


def test_same_image_again_hits_the_prefix_cache_without_the_encoder(client: openai.OpenAI,
                                                                    vision_engine: LLMEngine) -> None:
    msgs = _chat(data_url(sample_image(64, 30, 12)), "Describe it")
    before = vision_engine.vision.runs
    first = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0)  # type: ignore[arg-type]
    runs = vision_engine.vision.runs
    assert runs == before + 1                                    # a new image: encoded once
    again = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0)  # type: ignore[arg-type]
    assert vision_engine.vision.runs == runs                     # the encoder did not run again
    cached = again.usage.prompt_tokens_details.cached_tokens    # type: ignore[union-attr]
    assert cached >= 16 and again.choices[0].message.content == first.choices[0].message.content


@pytest.mark.parametrize("name", sorted(bad_images()))
def test_bad_images_are_a_400(server: LiveServer, name: str) -> None:
    mime, data = bad_images()[name]
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                   json={"model": MODEL, "messages": _chat(f"data:{mime};base64,{data}")})
    assert_error(r, 400, "messages[0].content[1]")


def test_remote_urls_are_refused(server: LiveServer) -> None:
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": MODEL, "messages": _chat("https://example.com/cat.png")})
    assert "not fetched" in assert_error(r, 400, "messages[0].content[1]")["message"]


def test_too_many_images(server: LiveServer) -> None:
    content = [{"type": "image_url", "image_url": {"url": IMAGE}}] * (MAX_IMAGES + 1)
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": content}]})
    assert "images in one request" in assert_error(r, 400, "messages")["message"]


def test_an_image_part_without_its_field(server: LiveServer) -> None:
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})
    assert r.status_code == 400, r.text


def test_a_model_without_vision_names_mmproj(engine: LLMEngine) -> None:
    with live_server(create_app(engine, served_model_name="text-only")) as srv:
        r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "text-only", "messages": _chat(IMAGE)})
        assert "--mmproj" in assert_error(r, 400, "messages[0].content[1]")["message"]


def test_prompt_logprobs_with_an_image_is_a_400(server: LiveServer) -> None:
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"model": MODEL, "messages": _chat(IMAGE), "prompt_logprobs": 1, "max_tokens": 1})
    assert_error(r, 400, "prompt_logprobs")


def test_encoder_runs_are_a_metric(server: LiveServer, vision_engine: LLMEngine) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)}
    (sample,) = fams["hitenter:vision_encoder_runs"].samples
    assert sample.labels == {"model_name": MODEL} and sample.value == vision_engine.vision.runs > 0
