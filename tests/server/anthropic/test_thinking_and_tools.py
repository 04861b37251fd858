"""Anthropic ``thinking`` and tool use per family (scripted replies in the family's own markup through
the real tokenizer, detokenizer and chat template; hitenter/testing/scripted.py) through the official
``anthropic`` client: ``thinking`` blocks and ``thinking_delta`` events, ``tool_use`` blocks, a round trip."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from hitenter.server.api import create_app
from hitenter.testing.live_server import live_server
from hitenter.testing.scripted import REPLIES, RESULT, family_client

TOOL = {"name": "get_weather", "description": "Current weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
THINK = {"type": "enabled", "budget_tokens": 1024}


@pytest.fixture(scope="module", params=sorted(REPLIES))
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any, anthropic.Anthropic]]:
    client = family_client(request.param)
    with live_server(create_app(client, served_model_name="m", playground=False)) as srv:
        yield request.param, client, anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)


def test_thinking_blocks(served: tuple[str, Any, anthropic.Anthropic]) -> None:
    family, _, ac = served
    r = REPLIES[family]
    msgs = [{"role": "user", "content": "Hi"}]
    if not r.thought:
        with pytest.raises(anthropic.BadRequestError):
            ac.messages.create(model="m", max_tokens=2000, messages=msgs, thinking=THINK)  # type: ignore[arg-type]
        return
    out = ac.messages.create(model="m", max_tokens=2000, messages=msgs, thinking=THINK)  # type: ignore[arg-type]
    assert [b.type for b in out.content] == ["thinking", "text"]
    assert (out.content[0].thinking, out.content[1].text) == (r.thought, r.text)  # type: ignore[union-attr]
    with ac.messages.stream(model="m", max_tokens=2000, messages=msgs, thinking=THINK) as s:  # type: ignore[arg-type]
        deltas = [e.delta.thinking for e in s if e.type == "content_block_delta" and e.delta.type == "thinking_delta"]
        final = s.get_final_message()
    assert "".join(deltas) == r.thought
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[1].text == r.text  # type: ignore[union-attr]


def test_tool_use_round_trip(served: tuple[str, Any, anthropic.Anthropic]) -> None:
    family, client, ac = served
    r = REPLIES[family]
    if not r.call:
        pytest.skip(f"{family}'s chat template takes no tools")
    first = ac.messages.create(model="m", max_tokens=200, messages=ASK, tools=[TOOL])  # type: ignore[arg-type,list-item]
    uses = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and [(u.name, u.input) for u in uses] == [("get_weather", {"city": "Paris"})]
    with ac.messages.stream(model="m", max_tokens=200, messages=ASK, tools=[TOOL]) as s:  # type: ignore[arg-type,list-item]
        streamed = s.get_final_message()
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [("get_weather", {"city": "Paris"})]
    history = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                   "content": RESULT}]}]
    final = ac.messages.create(model="m", max_tokens=200, messages=history, tools=[TOOL])  # type: ignore[arg-type,list-item]
    assert final.content[-1].text == r.final_text and RESULT in client.prompts[-1]  # type: ignore[union-attr]
