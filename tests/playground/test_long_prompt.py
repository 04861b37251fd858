"""A prompt longer than a trace holds (MAX_TRACE_TOKENS): the inside panels trace its last tokens and each says
which (positions offset..end of the prompt, run as a prompt of their own), never a raw error; a hovered traced
token lights the prompt chip and KV block at its real position. Real Chromium on the tiny llama server of
tests/playground/conftest.py (a 128-token window)."""

from __future__ import annotations

import json

import httpx
import pytest

from hitenter.server.playground_models import MAX_TRACE_TOKENS
from hitenter.testing.playground_page import CHROMIUM, enter

INSIDE = ("p-embed", "p-rope", "p-attn", "p-resid", "p-logits", "p-drill-softmax")


def _long_prompt(base: str, want: int) -> tuple[str, list[int]]:
    """Words until the chat-templated prompt has at least `want` tokens: (text, its ids)."""
    words = "the deploy failed on the second server so we rolled back and tried again".split()
    text = ""
    for i in range(1000):
        text = f"{text} {words[i % len(words)]}".strip()
        ids = httpx.post(f"{base}/playground/api/tokenize", json={"model": "tiny", "text": text, "chat": True}).json()["ids"]
        if len(ids) >= want:
            return text, ids
    raise AssertionError("no prompt long enough")


def test_trace_api_takes_the_last_tokens_when_asked(server) -> None:
    base = server[0]
    text, ids = _long_prompt(base, MAX_TRACE_TOKENS + 10)
    r = httpx.post(f"{base}/playground/api/trace", json={"model": "tiny", "text": text})
    assert r.status_code == 400 and "last: true" in r.json()["error"]["message"]
    r = httpx.post(f"{base}/playground/api/trace", json={"model": "tiny", "text": text, "last": True}, timeout=60)
    s = r.json()
    assert r.status_code == 200 and s["offset"] == len(ids) - MAX_TRACE_TOKENS and s["num_prompt_total"] == len(ids)
    assert [p["id"] for p in s["pieces"]] == ids[-MAX_TRACE_TOKENS:] and s["num_prompt"] == MAX_TRACE_TOKENS
    short = httpx.post(f"{base}/playground/api/trace", json={"model": "tiny", "text": "hi", "last": True}, timeout=60).json()
    assert short["offset"] == 0 and short["num_prompt_total"] == short["num_prompt"]


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's /usr/bin/chromium")
def test_inside_panels_trace_the_last_tokens_and_say_which(browser, server) -> None:
    base = server[0]
    text, ids = _long_prompt(base, MAX_TRACE_TOKENS + 10)
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    bad: list[str] = []
    pg.on("pageerror", lambda e: bad.append(str(e)))
    pg.on("console", lambda m: bad.append(m.text) if m.type == "error" else None)
    pg.on("response", lambda r: bad.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    pg.goto(base + "/")
    pg.wait_for_selector("body[data-ready=true]", timeout=20000)
    pg.click("#view-dash")
    traced = pg.evaluate("() => document.body.dataset.insideReady || ''")
    enter(pg, text, max_tokens=4)
    pg.wait_for_function(f"() => document.body.dataset.insideReady && document.body.dataset.insideReady !== '{traced}'",
                         timeout=60000)
    offset = len(ids) - MAX_TRACE_TOKENS
    for sec in INSIDE:
        note = pg.locator(f"#{sec} .trace-window")
        assert note.count() == 1, sec
        assert (note.get_attribute("data-offset"), note.get_attribute("data-total")) == (str(offset), str(len(ids)))
        assert f"last {MAX_TRACE_TOKENS} tokens" in note.inner_text() and f"positions {offset}–{len(ids) - 1}" in note.inner_text()
        assert pg.locator(f"#{sec} .trace-missing").count() == 0 and '{"error"' not in pg.inner_text(f"#{sec}")
    traced_ids = pg.eval_on_selector_all("#p-embed .tracetoks .tok", "ts => ts.map(t => +t.dataset.id)")
    assert traced_ids[:MAX_TRACE_TOKENS] == ids[-MAX_TRACE_TOKENS:]
    assert json.loads(pg.get_attribute("#prompt-tokens", "data-ids")) == ids
    j = 5                                          # traced position 5 is the prompt's position offset + 5
    pg.hover(f"#p-embed .tracetoks .tok[data-index='{j}']")
    lit = pg.evaluate("""() => { const chips = [...document.querySelectorAll('#prompt-tokens .tok')];
      return chips.map((c, i) => c.classList.contains('hl') ? i : -1).filter((i) => i >= 0); }""")
    assert lit == [offset + j]
    # a short prompt again: the note goes
    enter(pg, "hello there", max_tokens=4)
    pg.wait_for_function("() => !document.querySelector('.trace-window')", timeout=60000)
    pg.close()
    assert not bad, bad
