"""Enter on the first screen: the answer streams under the prompt box (and docked at the bottom of the window once
the header has scrolled away), with the engine's time to first token, tokens/s and KV counter; the page sends
one request while it times it; drawing is batched per animation frame. Real Chromium, the tiny llama server of
tests/playground/conftest.py."""

from __future__ import annotations

import json

import pytest

from hitenter.testing.paths import TEST_OUTPUT
from hitenter.testing.playground_page import CHROMIUM, finished

SHOTS = TEST_OUTPUT / "answer"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's /usr/bin/chromium")]

# every request the page starts, with the page clock, and when the /generate stream ends
RECORD = """() => {
  window.sent = [];
  const real = window.fetch;
  window.fetch = async (url, opts) => {
    const item = { url: String(url), t: performance.now(), end: null };
    window.sent.push(item);
    const r = await real(url, opts);
    if (!item.url.endsWith('/generate')) { item.end = performance.now(); return r; }
    const [a, b] = r.body.tee();            // the stream's end: when its copy is read to the end
    (async () => { const rd = b.getReader(); while (!(await rd.read()).done); item.end = performance.now(); })();
    return new Response(a, { status: r.status, headers: r.headers });
  };
}"""


def open_page(browser, server, width: int = 1400, height: int = 1000):
    pg = browser.new_page(viewport={"width": width, "height": height})
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.goto(server[0] + "/")
    pg.wait_for_selector("body[data-ready=true]", timeout=20000)
    return pg


def in_view(pg, sel: str) -> bool:
    return pg.evaluate("""(sel) => { const r = document.querySelector(sel).getBoundingClientRect();
      return r.height > 0 && r.top >= 0 && r.bottom <= innerHeight + 1 && r.left >= 0 && r.right <= innerWidth + 1; }""", sel)


@pytest.mark.parametrize("size", [(1400, 1000), (390, 844)], ids=["desktop", "phone"])
def test_enter_on_the_first_screen_streams_the_answer_in_view(browser, server, size) -> None:
    pg = open_page(browser, server, *size)
    assert pg.get_attribute("#story", "data-step") == "prompt"      # the first screen: story step 1
    pg.evaluate(RECORD)
    pg.fill("#max_tokens", "20")
    pg.set_checked("#ignore_eos", True)
    pg.press("#prompt", "Enter")
    pg.wait_for_function("() => { const a = document.querySelector('#answer-stats'); return a && +a.dataset.tokens >= 1; }",
                         timeout=30000)
    where = "#answer-text" if size[0] > 600 else "#answer-dock"        # a phone: the dock at the bottom, always in view
    assert in_view(pg, where) and pg.inner_text(where).strip()
    finished(pg)
    st = pg.evaluate("() => ({ ...document.querySelector('#answer-stats').dataset })")
    run = pg.evaluate("""() => { const r = window.playground.run; return { text: r.text, ttft: r.ttft, before: r.beforeEngine, n: r.tokens.length,
      steps: r.steps.filter((s) => s.mine).map((s) => [s.t_start, s.t_end, s.token ? 1 + (s.more || []).length : 0, s.cached_tokens,
      s.block_table.length]) }; }""")
    assert pg.text_content("#answer-text").rstrip("▍").strip() == run["text"].strip()
    if size[0] <= 600:
        assert run["text"].endswith(pg.get_attribute("#answer-dock", "data-tail"))
    assert int(st["tokens"]) == run["n"] == 20 and st["state"] == "done: length"
    # time to first token: the engine's metric plus the server's time from receiving the request to the engine's
    # arrival; tokens/s: tokens after the first over the engine's step clock
    assert run["before"] is not None and 0 <= run["before"] < 5
    assert float(st["engineTtft"]) == pytest.approx(run["ttft"]) and float(st["ttft"]) == pytest.approx(run["ttft"] + run["before"])
    sampled = [s for s in run["steps"] if s[2]]
    want_tps = (run["n"] - sampled[0][2]) / (sampled[-1][1] - sampled[0][1])
    assert float(st["tps"]) == pytest.approx(want_tps, rel=1e-9)
    assert pg.inner_text("#answer-tps b") == f"{want_tps:.1f}"
    last = run["steps"][-1]
    assert (int(st["kvTokens"]), int(st["kvBlocks"])) == (last[3], last[4])
    # the page's timeline reads the same step timestamps (decode steps' durations and the gaps between tokens)
    gaps = [b[1] - a[1] for a, b in zip(sampled, sampled[1:], strict=False)]
    assert float(pg.get_attribute("#tbt", "data-mean")) == pytest.approx(sum(gaps) / len(gaps), rel=1e-9)
    # one request while it is timed: nothing else starts between /generate's start and its end
    sent = pg.evaluate("() => window.sent")
    gen = next(x for x in sent if x["url"].endswith("/generate"))
    assert gen["end"] is not None
    during = [x["url"] for x in sent if gen["t"] < x["t"] < gen["end"]]
    assert during == [], during
    # afterwards the rest of the page is filled in, one request at a time (the trace among them)
    pg.wait_for_function("() => document.body.dataset.insideReady")
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SHOTS / f"first-screen-{size[0]}.png"))
    assert not pg.errors, pg.errors
    pg.close()


def test_the_answer_docks_at_the_bottom_once_the_header_scrolls_away(browser, server) -> None:
    pg = open_page(browser, server)
    pg.click("#view-dash")
    pg.press("#prompt", "Enter")
    finished(pg)
    assert pg.is_hidden("#answer-dock")
    pg.locator("#p-kv").scroll_into_view_if_needed()
    pg.wait_for_selector("#answer-dock:not([hidden])")
    assert in_view(pg, "#answer-dock")
    text = pg.evaluate("() => window.playground.run.text")
    tail = pg.get_attribute("#answer-dock", "data-tail")
    assert tail and text.endswith(tail)
    assert not pg.errors, pg.errors
    pg.close()


def test_streamed_events_draw_once_per_frame_and_only_what_is_on_screen(browser, server) -> None:
    """A run of many events redraws the panels on screen at most once per animation frame, and every panel at
    most every 500 ms plus once at the end (not every panel on every event)."""
    pg = open_page(browser, server)
    pg.fill("#max_tokens", "40")
    pg.set_checked("#ignore_eos", True)
    pg.set_checked("#with_trigram", False)
    pg.evaluate("""() => { window.frames0 = 0; const f = () => { window.frames0++; requestAnimationFrame(f); }; requestAnimationFrame(f);
      window.playground.draws.visible = 0; window.playground.draws.full = 0; window.t0 = performance.now(); }""")
    pg.press("#prompt", "Enter")
    finished(pg)
    r = pg.evaluate("""() => ({ draws: { ...window.playground.draws }, frames: window.frames0, ms: performance.now() - window.t0,
      events: window.playground.run.steps.length + 2 })""")
    draws = r["draws"]
    assert draws["visible"] + draws["full"] <= r["frames"] + 2, r
    assert draws["full"] <= r["ms"] / 500 + 3, r
    assert json.loads(pg.get_attribute("#gen-tokens", "data-ids")) == pg.evaluate(
        "() => window.playground.run.tokens.map((t) => t.piece.id)")          # the hidden panels are current at the end
    pg.close()
