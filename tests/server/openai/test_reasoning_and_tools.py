"""Thinking and tool calls on OpenAI chat, per family: scripted replies in the family's own markup
(hitenter/testing/scripted.py: the real tokenizer and detokenizer, the family's real chat template)
through the official ``openai`` client, streamed and not; a tool round trip (call, result, answer);
forced calls in the family's own format (the scripted reply must pass the real grammar)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from hitenter.server.api import create_app
from hitenter.testing.live_server import live_server
from hitenter.testing.scripted import REPLIES, RESULT, WEATHER_TOOL, family_client

FAMILIES = sorted(REPLIES)
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _tools(family: str) -> None:
    if not REPLIES[family].call:
        pytest.skip(f"{family}'s chat template takes no tools")


@pytest.fixture(scope="module", params=FAMILIES)
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any, openai.OpenAI]]:
    client = family_client(request.param)
    with live_server(create_app(client, served_model_name="m", playground=False)) as srv:
        yield request.param, client, openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)


def _stream(oai: openai.OpenAI, **kw: Any) -> tuple[str, str, dict[int, dict[str, str]], str | None]:
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in oai.chat.completions.create(model="m", stream=True, **kw):
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            extra = ch.delta.model_extra or {}
            reasoning += extra.get("reasoning_content") or ""
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                c["id"] += tc.id or ""
                c["name"] += (tc.function.name or "") if tc.function else ""
                c["arguments"] += (tc.function.arguments or "") if tc.function else ""
    return reasoning, content, calls, finish


def test_answer_with_thinking(served: tuple[str, Any, openai.OpenAI]) -> None:
    family, _, oai = served
    r = REPLIES[family]
    msg = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}]).choices[0].message
    assert msg.content == r.text
    assert (msg.model_extra or {}).get("reasoning_content", "") == r.thought
    reasoning, content, calls, finish = _stream(oai, messages=[{"role": "user", "content": "Hi"}])
    assert (reasoning, content, calls, finish) == (r.thought, r.text, {}, "stop")


def test_tool_call_streamed_and_not(served: tuple[str, Any, openai.OpenAI]) -> None:
    family, _, oai = served
    _tools(family)
    r = REPLIES[family]
    ch = oai.chat.completions.create(model="m", messages=ASK, tools=[WEATHER_TOOL]).choices[0]  # type: ignore[list-item]
    assert ch.finish_reason == "tool_calls" and ch.message.tool_calls, ch
    tc = ch.message.tool_calls[0]
    assert tc.function.name == "get_weather" and json.loads(tc.function.arguments) == {"city": "Paris"}
    assert (ch.message.model_extra or {}).get("reasoning_content", "") == r.thought
    assert not ch.message.content
    reasoning, content, calls, finish = _stream(oai, messages=ASK, tools=[WEATHER_TOOL])
    assert finish == "tool_calls" and reasoning == r.thought and content == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [("get_weather", {"city": "Paris"})]
    assert all(c["id"] for c in calls.values())


def test_tool_round_trip(served: tuple[str, Any, openai.OpenAI]) -> None:
    family, client, oai = served
    _tools(family)
    r = REPLIES[family]
    first = oai.chat.completions.create(model="m", messages=ASK, tools=[WEATHER_TOOL]).choices[0].message  # type: ignore[list-item]
    call = first.tool_calls[0]
    history = ASK + [first.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    final = oai.chat.completions.create(model="m", messages=history, tools=[WEATHER_TOOL]).choices[0]  # type: ignore[arg-type]
    assert final.finish_reason == "stop" and final.message.content == r.final_text
    prompt = client.prompts[-1]
    assert RESULT in prompt
    if "tool_call" in client.tokenizer.chat_template.split("available_tools")[-1]:   # it renders the call back
        assert "Paris" in prompt.split("What is the weather in Paris?", 1)[1]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_call_in_own_format(served: tuple[str, Any, openai.OpenAI], choice: Any) -> None:
    family, client, oai = served
    _tools(family)
    ch = oai.chat.completions.create(model="m", messages=ASK, tools=[WEATHER_TOOL], tool_choice=choice).choices[0]  # type: ignore[list-item]
    assert ch.finish_reason == "tool_calls"
    assert json.loads(ch.message.tool_calls[0].function.arguments) == {"city": "Paris"}
    assert client.params[-1].structured is not None and client.params[-1].structured.kind == "tool_calls"
    # thinking on (the default): the grammar waits for the thinking section to close (thinking_gate.py)
    assert (ch.message.model_extra or {}).get("reasoning_content", "") == REPLIES[family].thought
