"""Ollama ``think`` and tool calls per family (scripted replies in the family's own markup through the
real tokenizer, detokenizer and chat template; hitenter/testing/scripted.py) through the official
``ollama`` client: ``message.thinking`` streamed and not, calls parsed, a tool round trip."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ollama
import pytest

from hitenter.server.api import create_app
from hitenter.testing.live_server import live_server
from hitenter.testing.scripted import REPLIES, RESULT, WEATHER_TOOL, family_client

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module", params=sorted(REPLIES))
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any, ollama.Client]]:
    client = family_client(request.param)
    with live_server(create_app(client, served_model_name="m", playground=False)) as srv:
        yield request.param, client, ollama.Client(host=srv.url)


def test_think_streamed_and_not(served: tuple[str, Any, ollama.Client]) -> None:
    family, client, oc = served
    r = REPLIES[family]
    msgs = [{"role": "user", "content": "Hi"}]
    if not r.thought:
        with pytest.raises(ollama.ResponseError) as e:
            oc.chat(model="m", messages=msgs, think=True)
        assert e.value.status_code == 400
        return
    out = oc.chat(model="m", messages=msgs, think=True)
    assert (out.message.thinking, out.message.content) == (r.thought, r.text)
    thinking = content = ""
    for part in oc.chat(model="m", messages=msgs, think=True, stream=True):
        thinking += part.message.thinking or ""
        content += part.message.content or ""
    assert (thinking, content) == (r.thought, r.text)
    gen = oc.generate(model="m", prompt="Hi", think=True)
    assert (gen.thinking, gen.response) == (r.thought, r.text)


def test_tool_round_trip(served: tuple[str, Any, ollama.Client]) -> None:
    family, client, oc = served
    r = REPLIES[family]
    if not r.call:
        pytest.skip(f"{family}'s chat template takes no tools")
    first = oc.chat(model="m", messages=ASK, tools=[WEATHER_TOOL])
    calls = first.message.tool_calls or []
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    streamed = [c for part in oc.chat(model="m", messages=ASK, tools=[WEATHER_TOOL], stream=True)
                for c in part.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in streamed] == [("get_weather", {"city": "Paris"})]
    history = ASK + [first.message.model_dump(exclude_none=True),
                     {"role": "tool", "content": RESULT, "tool_name": "get_weather"}]
    final = oc.chat(model="m", messages=history, tools=[WEATHER_TOOL])
    assert final.message.content == r.final_text and RESULT in client.prompts[-1]
