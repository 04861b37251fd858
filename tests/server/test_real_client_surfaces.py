"""The real Qwen2.5-Coder-0.5B behind the official clients of every surface (slow, offline):
``ollama`` (chat, generate, stream, tools, format schema, embed, list, show, pull), ``langchain-ollama``
(ChatOllama invoke / stream / bind_tools), ``openai`` Responses (create, stream, function-call round trip,
json_schema, previous_response_id) and ``anthropic`` Messages (create, stream, tool_use round trip).
Greedy and a few tokens each, against one server."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import ollama
import openai
import pytest

from hitenter.engine.llm_engine import LLMEngine
from hitenter.server.api import create_app
from hitenter.testing.live_server import LiveServer, live_server

pytestmark = pytest.mark.slow
NAME = "qwen2.5-coder-0.5b-instruct"
HI = [{"role": "user", "content": "Say hello in one word."}]
ASK = [{"role": "user", "content": "What is the weather in Paris right now? Use the tool."}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                            "parameters": CITY}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}
GREEDY = {"temperature": 0, "num_predict": 8}
GREEDY_ANT = {"temperature": 0}         # the anthropic SDK (2.x) no longer has sampling arguments
RESULT = '{"temperature_c": 21, "sky": "clear"}'


@pytest.fixture(scope="module")
def qwen(qwen_coder_engine: LLMEngine) -> Iterator[LiveServer]:
    with live_server(create_app(qwen_coder_engine, served_model_name=NAME, playground=False)) as srv:
        yield srv


@pytest.fixture(scope="module")
def oll(qwen: LiveServer) -> ollama.Client:
    return ollama.Client(host=qwen.url, timeout=300)


# --- ollama -------------------------------------------------------------------------------------------


def test_ollama_chat_and_stream(oll: ollama.Client) -> None:
    r = oll.chat(model=NAME, messages=HI, options=GREEDY)
    assert r.done and r.message.role == "assistant" and r.message.content.strip()
    assert 0 < r.eval_count <= 8 and r.prompt_eval_count > 5 and r.total_duration >= r.eval_duration > 0
    parts = list(oll.chat(model=NAME + ":latest", messages=HI, options=GREEDY, stream=True))
    assert len(parts) >= 2 and parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content for p in parts) == r.message.content      # greedy: the same reply


def test_ollama_generate_and_context(oll: ollama.Client) -> None:
    r = oll.generate(model=NAME, prompt="def add(a, b):", options=GREEDY)
    assert r.done and r.response.strip() and r.context
    more = oll.generate(model=NAME, prompt="", context=r.context, options=GREEDY)   # an empty prompt loads
    assert more.done_reason == "load"
    cont = oll.generate(model=NAME, prompt=" Now subtract.", context=r.context, options=GREEDY)
    assert cont.response.strip() and len(cont.context) > len(r.context)
    streamed = "".join(p.response for p in oll.generate(model=NAME, prompt="def add(a, b):", options=GREEDY,
                                                        stream=True))
    assert streamed == r.response


def test_ollama_tools_round_trip(oll: ollama.Client) -> None:
    r = oll.chat(model=NAME, messages=ASK, tools=[WEATHER], options={"temperature": 0, "num_predict": 60})
    calls = r.message.tool_calls or []
    assert calls and calls[0].function.name == "get_weather", r.message
    assert "paris" in str(calls[0].function.arguments["city"]).lower()
    msgs = [*ASK, r.message.model_dump(exclude_none=True), {"role": "tool", "content": RESULT}]
    r2 = oll.chat(model=NAME, messages=msgs, options={"temperature": 0, "num_predict": 40})
    assert not r2.message.tool_calls and "21" in r2.message.content


def test_ollama_format_schema(oll: ollama.Client) -> None:
    r = oll.chat(model=NAME, messages=[{"role": "user", "content": "Invent a person."}], format=PERSON,
                 options={"temperature": 0, "num_predict": 60})
    jsonschema.validate(json.loads(r.message.content), PERSON)
    r = oll.generate(model=NAME, prompt="A JSON object:", format="json", options={"temperature": 0, "num_predict": 30})
    assert r.done_reason == "stop" and isinstance(json.loads(r.response), dict)


def test_ollama_embed_list_show_pull(oll: ollama.Client) -> None:
    e = oll.embed(model=NAME, input=["the cat", "a dog"])
    assert len(e.embeddings) == 2 and len(e.embeddings[0]) == 896
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-4) for v in e.embeddings)
    assert e.embeddings[0] != e.embeddings[1]
    assert [m.model for m in oll.list().models] == [NAME + ":latest"]
    s = oll.show(NAME)
    assert s.details.family == "qwen2" and "tools" in s.capabilities and s.modelinfo["qwen2.context_length"] >= 2048
    assert [m.model for m in oll.ps().models] == [NAME + ":latest"]
    events = list(oll.pull(NAME, stream=True))          # the registry's pull: cached and verified, no download
    assert events[0].status == "pulling manifest" and events[-1].status == "success"


def test_langchain_ollama(qwen: LiveServer) -> None:
    from langchain_ollama import ChatOllama
    from pydantic import BaseModel

    class GetWeather(BaseModel):
        """Current weather of a city"""
        city: str

    llm = ChatOllama(model=NAME, base_url=qwen.url, temperature=0, num_predict=8)
    msg = llm.invoke("Say hello in one word.")
    assert msg.content.strip() and msg.usage_metadata and msg.usage_metadata["output_tokens"] <= 8
    assert "".join(str(c.content) for c in llm.stream("Say hello in one word.")) == msg.content
    tooled = ChatOllama(model=NAME, base_url=qwen.url, temperature=0, num_predict=60).bind_tools([GetWeather])
    call = tooled.invoke(ASK[0]["content"])
    assert call.tool_calls and call.tool_calls[0]["name"] == "GetWeather" and call.tool_calls[0]["args"]["city"]


# --- openai Responses -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def oai(qwen: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=qwen.url + "/v1", api_key="x", max_retries=0, timeout=300)


def test_responses_create_and_stream(oai: openai.OpenAI) -> None:
    r = oai.responses.create(model=NAME, input="Say hello in one word.", temperature=0, max_output_tokens=8)
    assert r.output_text.strip() and r.usage is not None and 0 < r.usage.output_tokens <= 8
    with oai.responses.stream(model=NAME, input="Say hello in one word.", temperature=0, max_output_tokens=8) as s:
        deltas = [ev.delta for ev in s if ev.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text == r.output_text


def test_responses_function_call_round_trip(oai: openai.OpenAI) -> None:
    tool = {"type": "function", "name": "get_weather", "description": "Current weather of a city",
            "parameters": CITY}
    r = oai.responses.create(model=NAME, input=ASK[0]["content"], tools=[tool], tool_choice="required",  # type: ignore[arg-type]
                             temperature=0, max_output_tokens=60)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments)
    r2 = oai.responses.create(model=NAME, previous_response_id=r.id, tools=[tool], temperature=0,  # type: ignore[arg-type]
                              max_output_tokens=40,
                              input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": RESULT}])
    assert "21" in r2.output_text


def test_responses_previous_response_id(oai: openai.OpenAI) -> None:
    a = oai.responses.create(model=NAME, input="My name is Ada. Reply with OK.", temperature=0, max_output_tokens=4)
    b = oai.responses.create(model=NAME, previous_response_id=a.id, input="What is my name? One word.",
                             temperature=0, max_output_tokens=6)
    assert "Ada" in b.output_text                         # the conversation before came from the store
    assert oai.responses.retrieve(b.id).output_text == b.output_text
    oai.responses.delete(b.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(b.id)


def test_responses_json_schema(oai: openai.OpenAI) -> None:
    r = oai.responses.create(model=NAME, input="Invent a person.", temperature=0, max_output_tokens=60,
                             text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                                              "strict": True}})
    jsonschema.validate(json.loads(r.output_text), PERSON)


# --- anthropic Messages ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ant(qwen: LiveServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=qwen.url, api_key="x", max_retries=0, timeout=300)


def test_messages_create_and_stream(ant: anthropic.Anthropic) -> None:
    m = ant.messages.create(model=NAME, max_tokens=8, messages=HI, extra_body=GREEDY_ANT)  # type: ignore[arg-type]
    assert m.content[0].type == "text" and m.content[0].text.strip() and 0 < m.usage.output_tokens <= 8
    with ant.messages.stream(model=NAME, max_tokens=8, messages=HI, extra_body=GREEDY_ANT) as s:  # type: ignore[arg-type]
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == final.content[0].text == m.content[0].text and final.stop_reason == m.stop_reason


def test_messages_tool_use_round_trip(ant: anthropic.Anthropic) -> None:
    tools = [{"name": "get_weather", "description": "Current weather of a city", "input_schema": CITY}]
    m = ant.messages.create(model=NAME, max_tokens=60, messages=ASK, tools=tools,  # type: ignore[arg-type]
                            tool_choice={"type": "any"}, extra_body=GREEDY_ANT)
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and uses and uses[0].name == "get_weather" and "city" in uses[0].input
    follow: list[Any] = [*ASK, {"role": "assistant", "content": [b.model_dump() for b in m.content]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                       "content": RESULT}]}]
    m2 = ant.messages.create(model=NAME, max_tokens=40, messages=follow, tools=tools,
                             extra_body=GREEDY_ANT)  # type: ignore[arg-type]
    assert m2.content[0].type == "text" and "21" in m2.content[0].text
