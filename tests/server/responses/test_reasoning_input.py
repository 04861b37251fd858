"""Reasoning items sent back in a Responses ``input`` (Codex does, with ``store: false`` and
``include: ["reasoning.encrypted_content"]``): accepted, and rendered back into the template as the
assistant turn's thinking (Qwen3's template writes it inside ``<think>`` for turns after the last user
message); malformed ones are 400."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from hitenter.server.api import create_app
from hitenter.testing.live_server import live_server
from hitenter.testing.scripted import REPLIES, RESULT, family_client

TOOL = {"type": "function", "name": "get_weather", "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ASK = "What is the weather in Paris?"
THOUGHT = REPLIES["qwen3"].thought


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Any, str]]:
    client = family_client("qwen3")
    with live_server(create_app(client, served_model_name="m", playground=False)) as srv:
        yield client, srv.url


def _oai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def test_codex_style_round_trip_renders_thinking_back(served: tuple[Any, str]) -> None:
    client, url = served
    first = _oai(url).responses.create(model="m", input=ASK, tools=[TOOL], store=False,  # type: ignore[list-item]
                                       include=["reasoning.encrypted_content"])
    assert [i.type for i in first.output] == ["reasoning", "function_call"]
    assert first.output[0].encrypted_content == THOUGHT  # type: ignore[union-attr]
    call = first.output[1]
    back = [{"role": "user", "content": ASK}, *[i.model_dump(exclude_none=True) for i in first.output],
            {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}]  # type: ignore[union-attr]
    final = _oai(url).responses.create(model="m", input=back, tools=[TOOL], store=False)  # type: ignore[arg-type,list-item]
    assert final.output_text == REPLIES["qwen3"].final_text
    prompt = client.prompts[-1]
    assert f"<think>\n{THOUGHT}\n</think>" in prompt and RESULT in prompt


@pytest.mark.parametrize("item", [
    {"type": "reasoning", "summary": [], "encrypted_content": THOUGHT},                      # only encrypted
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": THOUGHT}]},           # only a summary
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": THOUGHT}],
     "status": "completed"},
])
def test_each_form_of_reasoning_item(served: tuple[Any, str], item: dict[str, Any]) -> None:
    client, url = served
    back = [{"role": "user", "content": ASK}, item,
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "c1", "output": RESULT}]
    resp = httpx.post(url + "/v1/responses", json={"model": "m", "input": back, "tools": [TOOL]})
    assert resp.status_code == 200, resp.text
    assert f"<think>\n{THOUGHT}\n</think>" in client.prompts[-1]


def test_reasoning_before_a_user_turn_is_dropped(served: tuple[Any, str]) -> None:
    client, url = served
    back = [{"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "stray"}]},
            {"role": "user", "content": "Hi"}]
    resp = httpx.post(url + "/v1/responses", json={"model": "m", "input": back})
    assert resp.status_code == 200, resp.text
    assert "stray" not in client.prompts[-1]


@pytest.mark.parametrize("item", [
    {"type": "reasoning", "summary": "no"},
    {"type": "reasoning", "summary": [], "content": [{"type": "image", "text": "x"}]},
    {"type": "reasoning", "summary": [], "secret": 1},
    {"type": "reasoning", "summary": [], "encrypted_content": 5},
])
def test_malformed_reasoning_item_is_400(served: tuple[Any, str], item: dict[str, Any]) -> None:
    _, url = served
    resp = httpx.post(url + "/v1/responses", json={"model": "m", "input": [item, {"role": "user", "content": "Hi"}]})
    assert resp.status_code == 400, resp.text
