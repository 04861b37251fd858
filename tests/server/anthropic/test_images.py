"""Anthropic image blocks (base64) with the official anthropic client (tiny random Gemma 3 + its mmproj): an
answer streamed and not, the same image again without the encoder running, and every bad image (bombs,
truncated, malformed, wrong media_type, url sources) a 400 in Anthropic's error shape."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import pytest

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.testing.live_server import LiveServer, live_server
from hitenter.testing.tiny_vision import bad_images, image_base64, sample_image

MODEL = "tiny-vision"


def _user(source: dict, text: str = "Describe the image") -> list[dict]:
    return [{"role": "user", "content": [{"type": "image", "source": source}, {"type": "text", "text": text}]}]


def _b64(rgb: object) -> dict:
    return {"type": "base64", "media_type": "image/png", "data": image_base64(rgb)}  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def server(vision_engine: LLMEngine) -> Iterator[LiveServer]:
    with live_server(create_app(vision_engine, MODEL, playground=False)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: LiveServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def test_image_answered_streamed_and_not(client: anthropic.Anthropic) -> None:
    msgs = _user(_b64(sample_image(36, 50, 21)))
    r = client.messages.create(model=MODEL, max_tokens=5, messages=msgs, extra_body={"temperature": 0})  # type: ignore[arg-type]
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 5 and r.usage.input_tokens > 16
    with client.messages.stream(model=MODEL, max_tokens=5, messages=msgs, extra_body={"temperature": 0}) as s:  # type: ignore[arg-type]
        final = s.get_final_message()
    assert final.content[0].text == r.content[0].text   # type: ignore[union-attr]


def test_same_image_again_without_the_encoder(client: anthropic.Anthropic, vision_engine: LLMEngine) -> None:
    msgs = _user(_b64(sample_image(50, 36, 22)), "What colour dominates?")
    before = vision_engine.vision.runs
    first = client.messages.create(model=MODEL, max_tokens=3, messages=msgs, extra_body={"temperature": 0})  # type: ignore[arg-type]
    runs = vision_engine.vision.runs
    assert runs == before + 1                                   # a new image: encoded once
    again = client.messages.create(model=MODEL, max_tokens=3, messages=msgs, extra_body={"temperature": 0})  # type: ignore[arg-type]
    assert vision_engine.vision.runs == runs and again.content == first.content


@pytest.mark.parametrize("name", sorted(bad_images()))
def test_bad_images_are_a_400(server: LiveServer, name: str) -> None:
    mime, data = bad_images()[name]
    r = httpx.post(server.url + "/v1/messages", timeout=30, json={
        "model": MODEL, "max_tokens": 4, "messages": _user({"type": "base64", "media_type": mime, "data": data})})
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error" and err["error"]["message"]


def test_url_sources_are_refused(server: LiveServer) -> None:
    r = httpx.post(server.url + "/v1/messages", json={
        "model": MODEL, "max_tokens": 4, "messages": _user({"type": "url", "url": "https://example.com/a.png"})})
    assert r.status_code == 400 and "base64" in r.json()["error"]["message"], r.text
