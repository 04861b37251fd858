"""Responses `input_image` parts (data: URLs) with the official openai client (tiny random Gemma 3 + its
mmproj): an answer streamed and not, the same image again without the encoder running, bad images and file
ids a 400."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.testing.live_server import LiveServer, assert_error, live_server
from hitenter.testing.tiny_vision import bad_images, data_url, sample_image

MODEL = "tiny-vision"


def _input(image: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "input_text", "text": "What is shown?"}, image]}]


@pytest.fixture(scope="module")
def server(vision_engine: LLMEngine) -> Iterator[LiveServer]:
    with live_server(create_app(vision_engine, MODEL, playground=False)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_image_answered_streamed_and_not(client: openai.OpenAI, vision_engine: LLMEngine) -> None:
    inp = _input({"type": "input_image", "image_url": data_url(sample_image(52, 40, 41)), "detail": "auto"})
    before = vision_engine.vision.runs
    r = client.responses.create(model=MODEL, input=inp, max_output_tokens=5, temperature=0)  # type: ignore[arg-type]
    assert r.usage is not None and r.usage.output_tokens == 5 and r.usage.input_tokens > 16
    runs = vision_engine.vision.runs
    assert runs == before + 1
    events = list(client.responses.create(model=MODEL, input=inp, max_output_tokens=5, temperature=0, stream=True))  # type: ignore[arg-type]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == r.output_text and vision_engine.vision.runs == runs


@pytest.mark.parametrize("name", sorted(bad_images()))
def test_bad_images_are_a_400(server: LiveServer, name: str) -> None:
    mime, data = bad_images()[name]
    r = httpx.post(server.url + "/v1/responses", timeout=30, json={
        "model": MODEL, "input": _input({"type": "input_image", "image_url": f"data:{mime};base64,{data}"})})
    assert_error(r, 400, "input")


def test_file_ids_are_refused(server: LiveServer) -> None:
    r = httpx.post(server.url + "/v1/responses", json={"model": MODEL, "input": _input({"type": "input_image", "file_id": "file-1"})})
    assert "file_id" in assert_error(r, 400)["message"]
