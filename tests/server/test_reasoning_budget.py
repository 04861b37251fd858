"""A reasoning budget on every surface, and forced calls that let the thinking close first.

Scripted replies (hitenter/testing/scripted.py) go through the engine's own thinking gate
(engine/thinking_gate.py): where the budget is spent the gate forces the model's end tag and the
script resumes after its own end tag, as a model would answer. Each surface must hand the engine the
budget it was given (OpenAI chat ``thinking_token_budget``, Anthropic ``thinking.budget_tokens``, the
server's ``--reasoning-budget`` for Ollama and Responses) and return the cut thinking separated from
the answer: the thinking is the first N tokens of the scripted thought, the answer the scripted one.
Families: qwen3 (the reply opens ``<think>``), deepseek_r1 (the prompt opens it), gpt_oss (harmony:
the budget writes the final channel's header)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from hitenter.server.api import create_app
from hitenter.server.chat_format import chat_format_of
from hitenter.testing.live_server import live_server
from hitenter.testing.scripted import REPLIES, WEATHER_TOOL, family_client

BUDGET = 3
FAMILIES = ["qwen3", "deepseek_r1", "gpt_oss"]
HI = [{"role": "user", "content": "Hi"}]


def cut_thought(client: Any, family: str, n: int) -> str:
    """The scripted thought's first ``n`` tokens as the reasoning parser returns them."""
    tok, r = client.tokenizer, REPLIES[family]
    fmt = chat_format_of(tok)
    ids = tok.encode(r.answer, add_bos=False)
    start = fmt.reasoning.start if family != "deepseek_r1" else ""
    skip = len(tok.encode(start, add_bos=False)) if start else 0
    text = "".join(tok.token_bytes(t).decode("utf-8", "replace") for t in ids[skip:skip + n])
    parser = fmt.reasoning.parser("<think>\n" if family == "deepseek_r1" else "")
    return parser.split(start + text)[0]


@pytest.fixture(scope="module", params=FAMILIES)
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any, str]]:
    client = family_client(request.param)
    with live_server(create_app(client, served_model_name="m", playground=False, reasoning_budget=BUDGET)) as srv:
        yield request.param, client, srv.url


@pytest.fixture(scope="module")
def unbounded() -> Iterator[tuple[Any, str]]:
    client = family_client("qwen3")
    with live_server(create_app(client, served_model_name="m", playground=False)) as srv:
        yield client, srv.url


def test_budget_cuts_thinking_on_every_surface(served: tuple[str, Any, str]) -> None:
    family, client, url = served
    r, want = REPLIES[family], cut_thought(client, family, BUDGET)
    assert want and r.thought.startswith(want) and want != r.thought
    oai = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    msg = oai.chat.completions.create(model="m", messages=HI).choices[0].message      # the server's budget
    assert ((msg.model_extra or {}).get("reasoning_content"), msg.content) == (want, r.text)
    assert client.params[-1].thinking is not None and client.params[-1].thinking.budget == BUDGET
    msg = oai.chat.completions.create(model="m", messages=HI, extra_body={"thinking_token_budget": 1}).choices[0].message
    assert ((msg.model_extra or {}).get("reasoning_content") or "", msg.content) == (cut_thought(client, family, 1), r.text)
    reasoning = content = ""
    for chunk in oai.chat.completions.create(model="m", messages=HI, stream=True):
        for ch in chunk.choices:
            reasoning += (ch.delta.model_extra or {}).get("reasoning_content") or ""
            content += ch.delta.content or ""
    assert (reasoning, content) == (want, r.text)
    ac = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
    out = ac.messages.create(model="m", max_tokens=100, messages=HI,  # type: ignore[arg-type]
                             thinking={"type": "enabled", "budget_tokens": 2})
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in out.content] == [
        ("thinking", cut_thought(client, family, 2)), ("text", r.text)]
    oc = ollama.Client(host=url)
    got = oc.chat(model="m", messages=HI, think=True)
    assert (got.message.thinking, got.message.content) == (want, r.text)
    resp = oai.responses.create(model="m", input="Hi", reasoning={"effort": "medium"})
    assert resp.output_text == r.text and resp.output[0].content[0].text == want  # type: ignore[union-attr,index]


def test_no_budget_leaves_thinking_whole(unbounded: tuple[Any, str]) -> None:
    client, url = unbounded
    oai = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    msg = oai.chat.completions.create(model="m", messages=HI).choices[0].message
    assert (msg.model_extra or {}).get("reasoning_content") == REPLIES["qwen3"].thought
    assert client.params[-1].thinking is None          # nothing for the engine to do


def test_forced_call_thinks_first(unbounded: tuple[Any, str]) -> None:
    """tool_choice required with thinking on: the grammar waits for the thinking to close (vLLM's way)."""
    client, url = unbounded
    oai = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    ch = oai.chat.completions.create(model="m", messages=ask, tools=[WEATHER_TOOL],  # type: ignore[list-item]
                                     tool_choice="required").choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.tool_calls[0].function.name == "get_weather"
    assert (ch.message.model_extra or {}).get("reasoning_content") == REPLIES["qwen3"].thought
    p = client.params[-1]
    assert p.structured is not None and p.thinking is not None and p.thinking.budget is None
    ch = oai.chat.completions.create(model="m", messages=ask, tools=[WEATHER_TOOL], tool_choice="required",  # type: ignore[list-item]
                                     reasoning_effort="none").choices[0]
    assert ch.finish_reason == "tool_calls" and client.params[-1].thinking is None   # thinking off: the call alone


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": HI, "thinking_token_budget": -1}, "thinking_token_budget"),
    ("/v1/chat/completions", {"messages": HI, "thinking_token_budget": "5"}, "thinking_token_budget"),
    ("/v1/chat/completions", {"messages": HI, "thinking_token_budget": 2.5}, "thinking_token_budget"),
    ("/v1/messages", {"messages": HI, "max_tokens": 10, "thinking": {"type": "enabled", "budget_tokens": 10}},
     "thinking.budget_tokens"),
    ("/v1/messages", {"messages": HI, "max_tokens": 10, "thinking": {"type": "enabled", "budget_tokens": 0}},
     "thinking.budget_tokens"),
])
def test_bad_budgets_are_400(unbounded: tuple[Any, str], path: str, body: dict[str, Any], param: str) -> None:
    _, url = unbounded
    resp = httpx.post(url + path, json={"model": "m", **body})
    assert resp.status_code == 400, resp.text
    assert param.split(".")[-1] in resp.text


def test_server_budget_option_checked() -> None:
    with pytest.raises(ValueError, match="reasoning_budget"):
        create_app(family_client("qwen3"), playground=False, reasoning_budget=-2)


@pytest.mark.slow
def test_real_engine_budget_then_forced_call(tmp_path: Any) -> None:
    """The real engine on a tiny random qwen3 (Qwen3.5's template opens <think>; <think> / </think> /
    <tool_call> are single tokens): a forced call with a budget of 3 thinks exactly 3 tokens, the engine
    writes </think>, then the grammar writes the call in the model's own (Qwen3-Coder XML) markup."""
    from hitenter.engine.llm_engine import LLMEngine
    from hitenter.testing.tiny_families import write_tiny_family
    from hitenter.testing.tiny_thinking import add_thinking_tokenizer

    path = write_tiny_family(tmp_path / "think.gguf", "qwen3", tokenizer=add_thinking_tokenizer)
    eng = LLMEngine(str(path))
    end = eng.tokenizer.encode("</think>", add_bos=False)[0]
    noop = {"type": "function", "function": {"name": "noop", "description": "does nothing",
                                             "parameters": {"type": "object", "properties": {}}}}
    with live_server(create_app(eng, served_model_name="m", playground=False)) as srv:
        oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        ch = oai.chat.completions.create(model="m", messages=HI, tools=[noop], tool_choice="required",  # type: ignore[list-item]
                                         temperature=0, max_tokens=60, logprobs=True,
                                         extra_body={"thinking_token_budget": 3}).choices[0]
    assert ch.finish_reason == "tool_calls" and [c.function.name for c in ch.message.tool_calls or []] == ["noop"]
    ids = [eng.tokenizer.encode(t.token, add_bos=False) for t in ch.logprobs.content]  # type: ignore[union-attr]
    assert ids[3] == [end], [t.token for t in ch.logprobs.content][:6]  # type: ignore[union-attr]
