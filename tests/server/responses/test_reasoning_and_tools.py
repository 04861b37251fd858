"""Responses reasoning items and function calls per family (scripted replies in the family's own markup
through the real tokenizer, detokenizer and chat template; hitenter/testing/scripted.py) through the
official ``openai`` client's ``responses`` API: a ``reasoning`` item and ``reasoning_tokens`` counted,
streamed and not; function calls and a round trip."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from hitenter.server.api import create_app
from hitenter.testing.live_server import live_server
from hitenter.testing.scripted import REPLIES, RESULT, family_client

TOOL = {"type": "function", "name": "get_weather", "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module", params=sorted(REPLIES))
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any, openai.OpenAI]]:
    client = family_client(request.param)
    with live_server(create_app(client, served_model_name="m", playground=False)) as srv:
        yield request.param, client, openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)


def test_reasoning_item(served: tuple[str, Any, openai.OpenAI]) -> None:
    family, _, oai = served
    r = REPLIES[family]
    out = oai.responses.create(model="m", input="Hi", reasoning={"effort": "medium"})
    kinds = [i.type for i in out.output]
    assert out.output_text == r.text
    if r.thought:
        assert kinds == ["reasoning", "message"] and out.output[0].content[0].text == r.thought  # type: ignore[union-attr,index]
        assert 0 < out.usage.output_tokens_details.reasoning_tokens < out.usage.output_tokens  # type: ignore[union-attr]
    else:
        assert kinds == ["message"] and out.usage.output_tokens_details.reasoning_tokens == 0  # type: ignore[union-attr]
    deltas, final = [], None
    for e in oai.responses.create(model="m", input="Hi", reasoning={"effort": "medium"}, stream=True):
        if e.type == "response.reasoning_text.delta":
            deltas.append(e.delta)
        if e.type == "response.completed":
            final = e.response
    assert "".join(deltas) == r.thought and final is not None and final.output_text == r.text
    assert [i.type for i in final.output] == kinds


def test_function_call_round_trip(served: tuple[str, Any, openai.OpenAI]) -> None:
    family, client, oai = served
    r = REPLIES[family]
    if not r.call:
        pytest.skip(f"{family}'s chat template takes no tools")
    ask = "What is the weather in Paris?"
    first = oai.responses.create(model="m", input=ask, tools=[TOOL])  # type: ignore[list-item]
    calls = [i for i in first.output if i.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    done = [e for e in oai.responses.create(model="m", input=ask, tools=[TOOL], stream=True)  # type: ignore[list-item]
            if e.type == "response.function_call_arguments.done"]
    assert [json.loads(e.arguments) for e in done] == [{"city": "Paris"}]
    final = oai.responses.create(model="m", previous_response_id=first.id, tools=[TOOL],  # type: ignore[list-item]
                                 input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": RESULT}])
    assert final.output_text == r.final_text and RESULT in client.prompts[-1]
