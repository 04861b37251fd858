"""Image refusals are paced per client: image_chat's bad-image 400s carry IMAGE_PACER, and api_error's
handler answers a client's refusals after its first IMAGE_PACE_FREE that much later (the delay asked of
asyncio.sleep is recorded, not timed); another client's first refusals are not delayed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from hitenter.server import api_error
from hitenter.server.api_error import APIError
from hitenter.server.body_limits import RefusalPacer
from hitenter.server.image_chat import IMAGE_PACE_DELAY_S, IMAGE_PACE_FREE, decode_images
from hitenter.testing.tiny_vision import bad_images


def _bad_image_error() -> APIError:
    mime, data = bad_images()["truncated"]
    with pytest.raises(APIError) as e:
        decode_images([("messages[0].content[0]", {"type": "image_url", "image_url": {
            "url": f"data:{mime};base64,{data}"}})], "messages")
    return e.value


def _answer(err: APIError, host: str, slept: list[float]) -> int:
    req: Any = SimpleNamespace(client=SimpleNamespace(host=host), url=SimpleNamespace(path="/v1/chat/completions"))
    return asyncio.run(api_error._api_error(req, err)).status_code


def test_bad_image_refusals_are_paced_per_client(monkeypatch: pytest.MonkeyPatch) -> None:
    err = _bad_image_error()
    assert err.status == 400
    pacer = RefusalPacer(free=IMAGE_PACE_FREE, window_s=10.0, delay_s=IMAGE_PACE_DELAY_S)
    monkeypatch.setattr(err, "pacer", pacer)     # a fresh pacer: other tests' refusals not counted
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
    monkeypatch.setattr(api_error.asyncio, "sleep", sleep)
    for _ in range(IMAGE_PACE_FREE):
        assert _answer(err, "10.0.0.1", slept) == 400
    assert slept == []
    assert _answer(err, "10.0.0.1", slept) == 400 and slept == [IMAGE_PACE_DELAY_S]
    assert _answer(err, "10.0.0.2", slept) == 400 and slept == [IMAGE_PACE_DELAY_S]   # another client


def test_other_errors_are_not_paced(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
    monkeypatch.setattr(api_error.asyncio, "sleep", sleep)
    for _ in range(IMAGE_PACE_FREE + 3):
        assert _answer(APIError(400, "bad"), "10.0.0.3", slept) == 400
    assert slept == []
