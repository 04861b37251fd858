"""Making it faster, prefill and decode apart, live: on a server started with disaggregate="prefill=1,decode=1"
(a prefill worker process of its own, hitenter/distributed/disagg.py) the page's disaggregation row shows the
page's own request as the worker reported it: how many prompt tokens it prefilled, its time, and the KV bytes
it shipped back; a server running both phases in one engine says so. Tiny random Llama, Debian's Chromium."""

from __future__ import annotations

import httpx
import pytest

from hitenter.testing.live_server import live_server
from hitenter.testing.paths import TEST_OUTPUT
from hitenter.testing.playground_page import CHROMIUM, TINY_OPTS, finished

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's /usr/bin/chromium")]


@pytest.fixture(scope="module")
def disagg(tiny_llama_path):
    from hitenter.engine.llm_engine import LLMEngine
    from hitenter.engine_options import engine_config
    from hitenter.server.api import create_app

    two = LLMEngine(config=engine_config(str(tiny_llama_path), None, dict(disaggregate="prefill=1,decode=1", **TINY_OPTS)))   # its runner registered
    one = LLMEngine(str(tiny_llama_path), **TINY_OPTS)
    app = create_app(two, "apart", extra_engines={"together": one})
    with live_server(app) as srv:
        yield srv.url
    two.runner.close()                    # the prefill worker process (also closed at exit)


def test_the_disaggregation_row_shows_the_workers_prefill_of_this_request(browser, disagg) -> None:
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    bad: list[str] = []
    pg.on("pageerror", lambda e: bad.append(str(e)))
    pg.on("response", lambda r: bad.append(f"{r.status} {r.url}") if r.status >= 500 else None)
    try:
        pg.goto(disagg + "/")
        pg.wait_for_selector("body[data-ready=true]", timeout=30000)
        pg.click("#view-dash")
        prompt = "the deploy failed on the staging cluster again"
        for model in ("apart", "together"):
            pg.select_option("#model", model)
            pg.set_checked("#chat", False)
            pg.set_checked("#with_trigram", False)
            pg.fill("#max_tokens", "6")
            pg.fill("#prompt", prompt)
            pg.evaluate("() => { const f = document.querySelector('#finish'); if (f) f.dataset.reason = ''; }")
            pg.press("#prompt", "Enter")
            finished(pg)
            if model == "apart":
                pg.wait_for_selector("#fast-disagg", timeout=30000)
                d = pg.evaluate("() => ({ ...document.querySelector('#fast-disagg').dataset })")
                ids = httpx.post(disagg + "/playground/api/tokenize", json={"model": model, "text": prompt, "chat": False}).json()["ids"]
                info = next(m for m in httpx.get(disagg + "/playground/api/models").json() if m["name"] == model)
                per, bs = info["kv_bytes_per_token"], info["block_size"]
                cached = pg.evaluate("() => window.playground.run.cached || 0")
                assert int(d["tokens"]) == len(ids) - 1 - cached         # all but the last prompt token, in the worker
                assert int(d["kvBytes"]) == -(-int(d["tokens"]) // bs) * bs * per    # their K and V, in whole blocks
                assert 0 < float(d["prefillS"]) <= float(d["totalS"]) and float(d["transferS"]) >= 0
                pg.evaluate("() => document.getElementById('p-fast').scrollIntoView({ block: 'start' })")
                (TEST_OUTPUT / "articles").mkdir(parents=True, exist_ok=True)
                pg.screenshot(path=str(TEST_OUTPUT / "articles" / "disaggregation-live.png"))
            else:
                pg.wait_for_function("() => !document.querySelector('#fast-disagg') && document.querySelector('#fast')"
                                     " && document.querySelector('#fast').textContent.includes('runs both phases in one engine')")
        assert not bad, bad
    finally:
        pg.close()
