"""Ollama `images` (base64) on /api/chat messages and /api/generate with the official ollama client (tiny random
Gemma 3 + its mmproj): answers streamed and not, the same image again without the encoder running, and
bad images a 400."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import ollama
import pytest

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.testing.live_server import LiveServer, live_server
from hitenter.testing.tiny_vision import bad_images, image_base64, sample_image

MODEL = "tiny-vision"
GREEDY = {"num_predict": 5, "temperature": 0}


@pytest.fixture(scope="module")
def server(vision_engine: LLMEngine) -> Iterator[LiveServer]:
    with live_server(create_app(vision_engine, MODEL, playground=False)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: LiveServer) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=60)


def test_chat_with_an_image_streamed_and_not(client: ollama.Client, vision_engine: LLMEngine) -> None:
    msgs = [{"role": "user", "content": "What is this?", "images": [image_base64(sample_image(44, 30, 31))]}]
    before = vision_engine.vision.runs
    r = client.chat(model=MODEL, messages=msgs, options=GREEDY)
    assert vision_engine.vision.runs == before + 1
    assert r.done and r.eval_count == 5 and (r.prompt_eval_count or 0) > 16
    text = "".join(p.message.content for p in client.chat(model=MODEL, messages=msgs, options=GREEDY, stream=True))
    assert text == r.message.content


def test_generate_with_an_image_streamed_and_not(client: ollama.Client, vision_engine: LLMEngine) -> None:
    img = image_base64(sample_image(30, 44, 32))
    before = vision_engine.vision.runs
    r = client.generate(model=MODEL, prompt="Describe it", images=[img], options=GREEDY)
    runs = vision_engine.vision.runs
    assert runs == before + 1
    text = "".join(p.response for p in client.generate(model=MODEL, prompt="Describe it", images=[img],
                                                        options=GREEDY, stream=True))
    assert text == r.response and vision_engine.vision.runs == runs   # the same image: not encoded again


# Ollama's images carry no MIME type, so a PNG labelled image/jpeg is no error here; its client refuses
# non-base64 data itself, hence the raw bodies
@pytest.mark.parametrize("name", sorted(set(bad_images()) - {"wrong_mime"}))
@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
def test_bad_images_are_a_400(server: LiveServer, name: str, path: str) -> None:
    _, data = bad_images()[name]
    body = ({"messages": [{"role": "user", "content": "x", "images": [data]}]} if path == "/api/chat"
            else {"prompt": "x", "images": [data]})
    r = httpx.post(server.url + path, json={"model": MODEL, "stream": False, **body}, timeout=30)
    assert r.status_code == 400 and r.json()["error"].startswith(
        "messages[0].images[0]: " if path == "/api/chat" else "images[0]: "), r.text


def test_raw_generate_with_images_is_refused(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model=MODEL, prompt="x", raw=True, images=[image_base64(sample_image())])
    assert e.value.status_code == 400 and "raw" in e.value.error
