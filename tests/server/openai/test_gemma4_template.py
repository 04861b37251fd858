"""Gemma 4's chat template through the OpenAI surface renders tool calls and tool results as llama.cpp does:
each request of tests/data/templates/gemma4-llamacpp-renders.json (parallel calls, a JSON tool result, a
final answer and a follow-up, thinking on and off) gives the prompt llama-server's /apply-template gave for
it (the README there says how it was made)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from hitenter.server.api import create_app
from hitenter.testing.live_server import live_server
from hitenter.testing.scripted import family_client

RENDERS = json.loads((Path(__file__).resolve().parents[2] / "data" / "templates" /
                      "gemma4-llamacpp-renders.json").read_text())


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Any, OpenAI]]:
    client = family_client("gemma4")
    with live_server(create_app(client, served_model_name="m", playground=False)) as srv:
        yield client, OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)


@pytest.mark.parametrize("case", RENDERS, ids=[f"conversation{i}" for i in range(len(RENDERS))])
def test_prompt_is_llamacpps(case: dict[str, Any], served: tuple[Any, OpenAI]) -> None:
    client, oc = served
    req = case["request"]
    oc.chat.completions.create(model="m", messages=req["messages"], tools=req["tools"], max_tokens=50,
                               extra_body={"chat_template_kwargs": req["chat_template_kwargs"]})
    assert client.prompts[-1] == case["llamacpp_prompt"]
