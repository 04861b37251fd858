"""Tool calls streamed as each one completes on Ollama, Anthropic and Responses (official clients, scripted
replies through the real tokenizer and parsers): a reply that thinks, calls, writes text, then calls
again must show the first call before the text that followed it, and Responses streams a call's
arguments as they are written (Qwen3-Coder's XML, parameter by parameter)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import ollama
import openai
import pytest

from hitenter.sampling_params import SamplingParams
from hitenter.server.api import create_app
from hitenter.testing.live_server import live_server
from hitenter.testing.scripted import WEATHER_TOOL, ScriptedClient, family_tokenizer

TWO = ('<think>\nTwo cities.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
       '</tool_call>\nAnd then\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')
XML = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=day>\nmonday\n"
       "</parameter>\n</function>\n</tool_call>")
ASK = [{"role": "user", "content": "Weather in Paris and Rome?"}]
A_TOOL = {"name": "get_weather", "description": "w", "input_schema": WEATHER_TOOL["function"]["parameters"]}  # type: ignore[index]
R_TOOL = {"type": "function", "name": "get_weather", "parameters": WEATHER_TOOL["function"]["parameters"]}  # type: ignore[index]


def _served(family: str, text: str) -> Iterator[str]:
    def script(prompt: str, params: SamplingParams) -> str:
        return text
    with live_server(create_app(ScriptedClient(family_tokenizer(family), script), served_model_name="m",
                                playground=False)) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def two_calls() -> Iterator[str]:
    yield from _served("qwen3", TWO)


@pytest.fixture(scope="module")
def xml_call() -> Iterator[str]:
    yield from _served("qwen3_coder", XML)


def test_ollama_sends_each_call_when_complete(two_calls: str) -> None:
    seq = []
    for part in ollama.Client(host=two_calls).chat(model="m", messages=ASK, tools=[WEATHER_TOOL], stream=True):
        seq += [("call", c.function.arguments["city"]) for c in part.message.tool_calls or []]
        seq += [("text", part.message.content)] if part.message.content else []
    assert seq[0] == ("call", "Paris") and seq[-1] == ("call", "Rome")
    assert "".join(t for k, t in seq if k == "text").strip() == "And then"


def test_anthropic_tool_use_blocks_in_order(two_calls: str) -> None:
    ac = anthropic.Anthropic(base_url=two_calls, api_key="x", max_retries=0)
    kinds = []
    with ac.messages.stream(model="m", max_tokens=500, messages=ASK, tools=[A_TOOL],  # type: ignore[arg-type,list-item]
                            thinking={"type": "enabled", "budget_tokens": 100}) as s:
        for e in s:
            if e.type == "content_block_start":
                kinds.append(e.content_block.type)
        final = s.get_final_message()
    assert kinds == ["thinking", "tool_use", "text", "tool_use"]
    assert [(b.type, getattr(b, "input", None)) for b in final.content if b.type == "tool_use"] == [
        ("tool_use", {"city": "Paris"}), ("tool_use", {"city": "Rome"})]
    assert final.stop_reason == "tool_use"


def test_responses_items_in_order(two_calls: str) -> None:
    oai = openai.OpenAI(base_url=two_calls + "/v1", api_key="x", max_retries=0)
    added, final = [], None
    for e in oai.responses.create(model="m", input="Weather?", tools=[R_TOOL], stream=True):  # type: ignore[list-item]
        if e.type == "response.output_item.added":
            added.append((e.output_index, e.item.type))
        if e.type == "response.completed":
            final = e.response
    assert added == [(0, "reasoning"), (1, "function_call"), (2, "message"), (3, "function_call")]
    assert final is not None and [i.type for i in final.output] == ["reasoning", "function_call", "message", "function_call"]
    assert [json.loads(i.arguments)["city"] for i in final.output if i.type == "function_call"] == ["Paris", "Rome"]


def test_responses_streams_arguments_as_written(xml_call: str) -> None:
    oai = openai.OpenAI(base_url=xml_call + "/v1", api_key="x", max_retries=0)
    deltas, done = [], None
    for e in oai.responses.create(model="m", input="Weather?", tools=[R_TOOL], stream=True):  # type: ignore[list-item]
        if e.type == "response.function_call_arguments.delta":
            deltas.append(e.delta)
        if e.type == "response.function_call_arguments.done":
            done = e.arguments
    assert len(deltas) >= 2 and "".join(deltas) == done
    assert json.loads(done) == {"city": "Paris", "day": "monday"}  # type: ignore[arg-type]


def test_stream_and_body_agree(two_calls: str) -> None:
    oai = openai.OpenAI(base_url=two_calls + "/v1", api_key="x", max_retries=0)
    body = oai.responses.create(model="m", input="Weather?", tools=[R_TOOL])  # type: ignore[list-item]
    calls: list[Any] = [i for i in body.output if i.type == "function_call"]
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Rome"]
