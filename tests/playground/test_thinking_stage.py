"""The playground's thinking stage: for a thinking model (a tiny random qwen3 whose vocabulary has <think> /
</think> and whose template, Qwen3.5's, opens <think> when thinking is on) /models says it thinks, the
template switch changes the prompt, and the /generate outputs carry the reply as two stages (what the model
thinks, what it answers) read by the model's own reasoning parser; the page draws them apart (real Chromium)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hitenter.testing.live_server import live_server
from hitenter.testing.playground_page import CHROMIUM, TINY_OPTS, finished
from hitenter.testing.tiny_families import write_tiny_family
from hitenter.testing.tiny_thinking import add_thinking_tokenizer


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from hitenter.engine.llm_engine import LLMEngine
    from hitenter.server.api import create_app

    path: Path = write_tiny_family(tmp_path_factory.mktemp("think") / "think.gguf", "qwen3", tokenizer=add_thinking_tokenizer)
    app = create_app(LLMEngine(str(path), **{**TINY_OPTS, "max_model_len": 256, "kv_cache_memory": 64 * 4 * 1024}),
                     "thinker", extra_engines={"trigram": LLMEngine("trigram", kv_cache_memory=1 << 16, block_size=4)})
    with live_server(app) as srv:
        yield srv.url


def _outputs(url: str, **body: Any) -> list[dict[str, Any]]:
    events = []
    with httpx.stream("POST", url + "/playground/api/generate", json={"model": "thinker", "text": "Hi", **body},
                      timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    return [e for e in events if e["type"] == "output"]


@pytest.mark.slow
def test_api_thinking_stages_and_switch(thinking_server: str) -> None:
    url = thinking_server
    models = {m["name"]: m for m in httpx.get(url + "/playground/api/models").json()}
    assert models["thinker"]["thinks"] is True and models["trigram"]["thinks"] is False
    tok = {think: httpx.post(url + "/playground/api/tokenize", json={"model": "thinker", "text": "Hi", "think": think}).json()
           for think in (True, False)}
    text = {k: "".join(p["text"] for p in v["pieces"]) for k, v in tok.items()}
    assert text[True].endswith("<think>\n") and text[False].endswith("<think>\n\n</think>\n\n")
    params = {"temperature": 0, "max_tokens": 12}
    on = _outputs(url, think=True, params=params)[-1]
    assert on["finished"] and on["thinking"] == on["text"].strip() and on["answer"] == ""   # the prompt opened it
    off = _outputs(url, think=False, params=params)[-1]
    assert off["thinking"] == "" and off["answer"] == off["text"]                            # closed in the prompt
    assert "thinking" not in _outputs(url, params=params, model="trigram")[-1]
    bad = httpx.post(url + "/playground/api/generate", json={"model": "thinker", "text": "Hi", "think": "yes"})
    assert bad.status_code == 400


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's /usr/bin/chromium")
def test_page_draws_thinking_apart_from_the_answer(browser: Any, thinking_server: str) -> None:
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(thinking_server + "/")
    pg.wait_for_selector("body[data-ready=true]", timeout=20000)
    pg.select_option("#model", "thinker")
    assert pg.is_visible("#think") and pg.is_checked("#think")
    pg.fill("#max_tokens", "10")
    pg.set_checked("#ignore_eos", True)
    pg.press("#prompt", "Enter")
    finished(pg)
    run = pg.evaluate("() => { const r = window.playground.run; return { text: r.text, thinking: r.thinking, answer: r.answer }; }")
    assert run["thinking"] == run["text"].strip() and run["answer"] == ""
    assert pg.text_content("#answer-thinking").endswith(run["thinking"])
    pg.set_checked("#think", False)
    pg.press("#prompt", "Enter")
    pg.wait_for_function("() => { const r = window.playground.run; return r.finish && r.thinking === ''; }", timeout=30000)
    answer = pg.evaluate("() => window.playground.run.answer")
    assert answer and pg.text_content("#answer-text").rstrip("▍").strip() == answer.strip()
    pg.select_option("#model", "trigram")
    assert not pg.is_visible("#think")
    assert not errors, errors
    pg.close()
