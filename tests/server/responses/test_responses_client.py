"""OpenAI Responses with the official ``openai`` client against a live server (tiny random Qwen2) on
127.0.0.1: text with instructions, input items, the function-call round trip with
``previous_response_id``, ``text.format`` json_schema, ``responses.stream`` as the SDK parses it, the
raw event sequence, the store, and every bad input a 4xx in OpenAI's error shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.testing.live_server import LiveServer, assert_error, live_server

TOOL = {"type": "function", "name": "get_weather", "description": "weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,6}$"}}, "required": ["city"],
    "additionalProperties": False}}
SCHEMA = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"], "additionalProperties": False}


class Answer(BaseModel):
    a: Literal["x", "y"]


@pytest.fixture(scope="module")
def server(tools_engine: LLMEngine) -> Iterator[LiveServer]:
    with live_server(create_app(tools_engine, "tiny", playground=False)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_text_with_instructions(client: openai.OpenAI, server: LiveServer) -> None:
    r = client.responses.create(model="tiny", input="Hello world", instructions="Be brief.", max_output_tokens=6,
                                temperature=0)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "tiny"
    assert r.status == "incomplete" and r.incomplete_details and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage and r.usage.output_tokens == 6 and r.usage.total_tokens == r.usage.input_tokens + 6
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world"}]
    chat = httpx.post(server.url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 6, "temperature": 0})
    assert r.output_text == chat.json()["choices"][0]["message"]["content"]
    items = client.responses.create(model="tiny", max_output_tokens=6, temperature=0, input=[
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello world"}]}])
    assert items.output_text == r.output_text


def test_function_call_round_trip(client: openai.OpenAI) -> None:
    first = client.responses.create(model="tiny", input="Weather in Paris?", tools=[TOOL], tool_choice="required",  # type: ignore[list-item]
                                    parallel_tool_calls=False, max_output_tokens=200)
    calls = [o for o in first.output if o.type == "function_call"]
    assert first.status == "completed" and len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments)["city"].isalpha() and calls[0].call_id
    follow = client.responses.create(model="tiny", previous_response_id=first.id, max_output_tokens=4, input=[
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}])
    assert follow.previous_response_id == first.id and follow.output_text is not None
    again = client.responses.create(model="tiny", max_output_tokens=4, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}])
    assert again.usage and follow.usage and again.usage.input_tokens == follow.usage.input_tokens   # same history


def test_json_schema_and_parse(client: openai.OpenAI) -> None:
    r = client.responses.create(model="tiny", input="A letter", max_output_tokens=40,
                                text={"format": {"type": "json_schema", "name": "a", "schema": SCHEMA, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), SCHEMA)
    parsed = client.responses.parse(model="tiny", input="A letter", text_format=Answer, max_output_tokens=40)
    assert parsed.output_parsed is not None and parsed.output_parsed.a in ("x", "y")


def test_stream_as_the_sdk_parses_it(client: openai.OpenAI) -> None:
    fmt = {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA}}
    with client.responses.stream(model="tiny", input="A letter", text=fmt, max_output_tokens=40) as stream:  # type: ignore[arg-type]
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text and json.loads(final.output_text)["a"] in ("x", "y")
    events = list(client.responses.create(model="tiny", input="Hello", max_output_tokens=3, temperature=0,
                                         stream=True))   # greedy: a sampled EOS would end it early
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    with client.responses.stream(model="tiny", input="Weather?", tools=[TOOL], tool_choice="required",  # type: ignore[list-item]
                                 parallel_tool_calls=False, max_output_tokens=200) as stream:
        args = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        done = stream.get_final_response()
    calls = [o for o in done.output if o.type == "function_call"]
    assert calls and "".join(args) == "".join(c.arguments for c in calls)


def test_store_get_delete(client: openai.OpenAI, server: LiveServer) -> None:
    r = client.responses.create(model="tiny", input="Hello", max_output_tokens=2)
    assert client.responses.retrieve(r.id).id == r.id
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    unstored = client.responses.create(model="tiny", input="Hello", max_output_tokens=2, store=False)
    assert_error(httpx.get(f"{server.url}/v1/responses/{unstored.id}"), 404)


@pytest.mark.parametrize("body,param", [
    ({"input": "x", "frobnicate": 1}, "frobnicate"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input"),
    ({"input": [{"role": "user", "content": "x", "mood": 1}]}, None),
    ({"input": []}, "input"),
    ({"input": "x", "max_output_tokens": "5"}, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": 5.0}, "max_output_tokens"),
    ({"input": "x", "temperature": 3}, "temperature"),
    ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, None),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, None),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "include": ["file_search_call.results"]}, "include"),
    ({"input": "x", "model": "nope"}, "model"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{not json"}]}, "input"),
])
def test_bad_inputs_are_4xx(server: LiveServer, body: dict[str, Any], param: str | None) -> None:
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=30)
    assert 400 <= r.status_code < 500, r.text
    e = assert_error(r, r.status_code)
    assert param is None or e["param"] == param or (e["param"] or "").startswith(param), e
