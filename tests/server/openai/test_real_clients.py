"""Structured outputs and tool calls with real models and real clients (slow): 50 generated JSON schemas on SmolLM2 at
temperature 1; tool calls on Qwen2.5-Coder-0.5B through the openai client and langchain-openai."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from hitenter.engine.llm_engine import LLMEngine
from hitenter.llm import LLM
from hitenter.sampling_params import SamplingParams, StructuredSpec
from hitenter.server.api import create_app
from hitenter.testing.json_schemas import random_schemas
from hitenter.testing.live_server import LiveServer, live_server

pytestmark = pytest.mark.slow
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now? Use the tool."}]


def test_smollm2_50_json_schemas(smollm2_llm: LLM) -> None:
    llm = smollm2_llm
    schemas = random_schemas(50, seed=1)
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=400, structured=StructuredSpec("json_schema", json.dumps(s)))
              for i, s in enumerate(schemas)]
    outs = llm.generate(["Here is the JSON object:"] * len(params), params)
    for s, out in zip(schemas, outs, strict=True):
        assert out.finish_reason == "stop", (s, out.text)
        jsonschema.validate(json.loads(out.text), s)


@pytest.fixture(scope="module")
def qwen(qwen_coder_engine: LLMEngine) -> Iterator[LiveServer]:
    with live_server(create_app(qwen_coder_engine, served_model_name="qwen")) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(qwen: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=qwen.url + "/v1", api_key="x", max_retries=0, timeout=300)


def _call(client: openai.OpenAI, **kw: Any) -> Any:
    return client.chat.completions.create(model="qwen", messages=ASK, tools=[WEATHER], temperature=0,  # type: ignore[arg-type]
                                          max_tokens=80, **kw)


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {"name": "get_weather"}}])
def test_openai_client_tool_calls(client: openai.OpenAI, choice: Any) -> None:
    r = _call(client, tool_choice=choice)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.tool_calls, ch
    tc = ch.message.tool_calls[0]
    assert tc.function.name == "get_weather" and "paris" in json.loads(tc.function.arguments)["city"].lower()


def test_openai_client_streamed_tool_calls(client: openai.OpenAI) -> None:
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in _call(client, tool_choice="required", stream=True):
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            for tc in ch.delta.tool_calls or []:
                c = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                c["name"] += (tc.function.name or "") if tc.function else ""
                c["arguments"] += (tc.function.arguments or "") if tc.function else ""
    assert finish == "tool_calls" and calls[0]["name"] == "get_weather"
    assert "city" in json.loads(calls[0]["arguments"])


def test_tool_round_trip(client: openai.OpenAI) -> None:
    r = _call(client, tool_choice="required")
    tc = r.choices[0].message.tool_calls[0]
    msgs = [*ASK, {"role": "assistant", "content": None, "tool_calls": [tc.model_dump()]},
            {"role": "tool", "tool_call_id": tc.id, "content": '{"temperature_c": 21, "sky": "clear"}'}]
    r2 = client.chat.completions.create(model="qwen", messages=msgs, tools=[WEATHER], temperature=0,  # type: ignore[arg-type]
                                        max_tokens=60, tool_choice="none")
    assert r2.choices[0].finish_reason in ("stop", "length") and "21" in (r2.choices[0].message.content or "")


def test_langchain_bind_tools_and_structured_output(qwen: LiveServer) -> None:
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel

    class GetWeather(BaseModel):
        """Current weather of a city"""
        city: str

    llm = ChatOpenAI(base_url=qwen.url + "/v1", api_key="x", model="qwen", temperature=0, max_tokens=80)
    msg = llm.bind_tools([GetWeather], tool_choice="GetWeather").invoke(ASK[0]["content"])
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "GetWeather" and msg.tool_calls[0]["args"]["city"]
    out = llm.with_structured_output(GetWeather, method="function_calling").invoke(ASK[0]["content"])
    assert isinstance(out, GetWeather) and "paris" in out.city.lower()


def test_template_without_tools(smollm2_llm: LLM) -> None:
    with live_server(create_app(smollm2_llm.engine)) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="does not support tools"):
            c.chat.completions.create(model="smollm2-135m-instruct", messages=ASK, tools=[WEATHER])  # type: ignore[arg-type]
