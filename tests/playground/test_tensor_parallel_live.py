"""Making it faster, bigger models split over processes, live: on a server started with tensor_parallel_size=2
(hitenter/distributed/runner.py: a second process holds half of every layer) the page's "bigger models" row
shows what the processes exchanged while the page's request ran (rank 0's collectives: how many, how long);
a one-process server says it runs the model in one process. Tiny random Llama, Debian's Chromium."""

from __future__ import annotations

import pytest

from hitenter.testing.live_server import live_server
from hitenter.testing.paths import TEST_OUTPUT
from hitenter.testing.playground_page import CHROMIUM, TINY_OPTS, finished

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's /usr/bin/chromium")]


@pytest.fixture(scope="module")
def split(tiny_llama_path):
    from hitenter.engine.llm_engine import LLMEngine
    from hitenter.engine_options import engine_config
    from hitenter.server.api import create_app

    two = LLMEngine(config=engine_config(str(tiny_llama_path), None, dict(tensor_parallel_size=2, **TINY_OPTS)))   # its runner registered
    one = LLMEngine(str(tiny_llama_path), **TINY_OPTS)
    app = create_app(two, "split", extra_engines={"whole": one})
    with live_server(app) as srv:
        yield srv.url, two
    two.runner.close()                    # the second process (also closed at exit)


def test_the_bigger_models_row_shows_the_processes_messages_for_this_request(browser, split) -> None:
    base, eng = split
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    bad: list[str] = []
    pg.on("pageerror", lambda e: bad.append(str(e)))
    pg.on("response", lambda r: bad.append(f"{r.status} {r.url}") if r.status >= 500 else None)
    try:
        pg.goto(base + "/")
        pg.wait_for_selector("body[data-ready=true]", timeout=30000)
        pg.click("#view-dash")
        for model in ("split", "whole"):
            pg.select_option("#model", model)
            pg.set_checked("#chat", False)
            pg.set_checked("#with_trigram", False)
            pg.fill("#max_tokens", "6")
            pg.fill("#prompt", "the deploy failed on the staging cluster again")
            pg.evaluate("() => { const f = document.querySelector('#finish'); if (f) f.dataset.reason = ''; }")
            calls0 = eng.runner.model.group.comm_calls
            pg.press("#prompt", "Enter")
            finished(pg)
            if model == "split":
                pg.wait_for_selector("#fast-tp", timeout=30000)
                t = pg.evaluate("() => ({ ...document.querySelector('#fast-tp').dataset })")
                steps = int(t["steps"])
                assert int(t["size"]) == 2 and steps >= 6
                # rank 0's own count: the collectives of the request's steps (at least one per step), nothing else
                # ran on this engine meanwhile but the page's own request
                assert int(t["calls"]) >= steps and int(t["calls"]) <= eng.runner.model.group.comm_calls - calls0
                assert float(t["seconds"]) > 0
                pg.evaluate("() => document.getElementById('p-fast').scrollIntoView({ block: 'start' })")
                (TEST_OUTPUT / "articles").mkdir(parents=True, exist_ok=True)
                pg.screenshot(path=str(TEST_OUTPUT / "articles" / "tensor-parallel-live.png"))
            else:
                pg.wait_for_function("() => !document.querySelector('#fast-tp') && document.querySelector('#fast')"
                                     " && document.querySelector('#fast').textContent.includes('runs the model in one process')")
        assert not bad, bad
    finally:
        pg.close()
