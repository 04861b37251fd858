"""Anthropic Messages with the official ``anthropic`` client against a live server (tiny random Qwen2)
on 127.0.0.1, behind ``--api-key`` sent as ``x-api-key``: text with a system prompt, stop sequences,
the tool_use / tool_result round trip, ``messages.stream`` as the SDK accumulates it, count_tokens,
and every bad input a 4xx in Anthropic's error shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.testing.live_server import LiveServer, live_server

KEY = "sk-ant-test"
TOOL = {"name": "get_weather", "description": "weather of a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,6}$"}}, "required": ["city"],
    "additionalProperties": False}}
USER = [{"role": "user", "content": "Hello world"}]


@pytest.fixture(scope="module")
def server(tools_engine: LLMEngine) -> Iterator[LiveServer]:
    with live_server(create_app(tools_engine, "tiny", api_key=KEY, playground=False)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: LiveServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=60)


def test_text_system_and_stop(client: anthropic.Anthropic, server: LiveServer) -> None:
    r = client.messages.create(model="tiny", max_tokens=6, messages=USER, system="Be brief.", extra_body={"temperature": 0})  # type: ignore[arg-type]
    assert r.id.startswith("msg_") and r.type == "message" and r.role == "assistant" and r.model == "tiny"
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 6 and r.content[0].type == "text"
    msgs = [{"role": "system", "content": "Be brief."}, *USER]
    chat = httpx.post(server.url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 6, "temperature": 0},
                      headers={"x-api-key": KEY}).json()
    assert r.content[0].text == chat["choices"][0]["message"]["content"]
    text = r.content[0].text  # type: ignore[union-attr]
    stop = next((w for i in range(1, len(text) - 1) if (w := text[i:i + 2]).strip() and w.isascii() and w.isprintable()), "")
    if stop:
        s = client.messages.create(model="tiny", max_tokens=6, messages=USER, system="Be brief.", extra_body={"temperature": 0},  # type: ignore[arg-type]
                                   stop_sequences=[stop])
        assert s.stop_reason == "stop_sequence" and s.stop_sequence == stop and stop not in s.content[0].text
    n = client.messages.count_tokens(model="tiny", messages=USER, system="Be brief.")  # type: ignore[arg-type]
    assert n.input_tokens == r.usage.input_tokens


def test_structured_output(client: anthropic.Anthropic) -> None:
    schema = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"], "additionalProperties": False}
    r = client.messages.create(model="tiny", max_tokens=40, messages=USER,  # type: ignore[arg-type]
                               extra_body={"output_config": {"format": {"type": "json_schema", "schema": schema}}})
    jsonschema.validate(json.loads(r.content[0].text), schema)  # type: ignore[union-attr]


def test_tool_use_round_trip(client: anthropic.Anthropic) -> None:
    r = client.messages.create(model="tiny", max_tokens=200, messages=USER, tools=[TOOL],  # type: ignore[list-item, arg-type]
                               tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True})
    uses = [b for b in r.content if b.type == "tool_use"]
    assert r.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather"
    assert uses[0].id.startswith("toolu_") and uses[0].input["city"].isalpha()  # type: ignore[index]
    follow = client.messages.create(model="tiny", max_tokens=4, tools=[TOOL], messages=[  # type: ignore[list-item]
        *USER, {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": "get_weather",
                                                  "input": uses[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny"},
                                     {"type": "text", "text": "And tomorrow?"}]}])
    assert follow.stop_reason in ("max_tokens", "end_turn", "tool_use")
    again = client.messages.create(model="tiny", max_tokens=4, tools=[TOOL], messages=[  # type: ignore[list-item]
        *USER, {"role": "assistant", "content": [b.model_dump() for b in r.content]},   # caller/toolset_name: null
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny"}]}])
    assert again.stop_reason in ("max_tokens", "end_turn", "tool_use")


def test_stream_as_the_sdk_accumulates_it(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model="tiny", max_tokens=6, messages=USER, extra_body={"temperature": 0}) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    whole = client.messages.create(model="tiny", max_tokens=6, messages=USER, extra_body={"temperature": 0})  # type: ignore[arg-type]
    assert text == final.content[0].text == whole.content[0].text and final.stop_reason == "max_tokens"  # type: ignore[union-attr]
    assert final.usage.output_tokens == 6 and final.usage.input_tokens == whole.usage.input_tokens
    with client.messages.stream(model="tiny", max_tokens=200, messages=USER, tools=[TOOL],  # type: ignore[list-item, arg-type]
                                tool_choice={"type": "any", "disable_parallel_tool_use": True}) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and uses and all(isinstance(u.input, dict) and "city" in u.input for u in uses)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"


def test_key_errors(server: LiveServer) -> None:
    bad = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="tiny", max_tokens=2, messages=USER)  # type: ignore[arg-type]
    with pytest.raises(anthropic.NotFoundError):
        anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0).messages.create(
            model="nope", max_tokens=2, messages=USER)  # type: ignore[arg-type]


@pytest.mark.parametrize("body", [
    {"messages": USER},                                                      # no max_tokens
    {"max_tokens": 5},                                                       # no messages
    {"max_tokens": 5, "messages": []},
    {"max_tokens": "5", "messages": USER},
    {"max_tokens": 5.0, "messages": USER},
    {"max_tokens": 5, "messages": USER, "temperature": 1.5},
    {"max_tokens": 5, "messages": USER, "frobnicate": 1},
    {"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
    {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
    {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "y": 1}]}]},
    {"max_tokens": 5, "messages": USER, "thinking": {"type": "enabled", "budget_tokens": 1024}},
    {"max_tokens": 5, "messages": USER, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
    {"max_tokens": 5, "messages": USER, "tool_choice": {"type": "any"}},
    {"max_tokens": 5, "messages": USER, "tools": [TOOL], "tool_choice": {"type": "tool", "name": "other"}},
    {"max_tokens": 5, "messages": USER, "stop_sequences": [""]},
    {"max_tokens": 10**6, "messages": USER},
])
def test_bad_inputs_are_4xx_in_anthropics_shape(server: LiveServer, body: dict[str, Any]) -> None:
    r = httpx.post(server.url + "/v1/messages", json={"model": "tiny", **body}, headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error" and err["error"]["message"]
