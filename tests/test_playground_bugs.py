"""One browser check per fixed playground bug (issue 18, part 5); each failed on the page before its fix.
Fixtures come from test_playground.py (the tiny llama model and the trigram toy behind the real server)."""

from __future__ import annotations

import re

import pytest
from test_playground import CHROMIUM, browser, enter, finished, gen_ids, server  # noqa: F401

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's /usr/bin/chromium")

# The first /reshape answer after arming arrives 800 ms late (a slow server), the later ones at once.
SLOW_FIRST_RESHAPE = """() => {
  const real = window.fetch;
  let armed = true;
  window.fetch = async (url, opts) => {
    const r = await real(url, opts);
    if (armed && String(url).endsWith('/reshape')) { armed = false; await new Promise((ok) => setTimeout(ok, 800)); }
    return r;
  };
}"""


@pytest.fixture
def pg(server, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server[0] + "/")
    page.wait_for_selector("body[data-ready=true]", timeout=20000)
    if page.locator("#view-dash").count():   # (the page before story mode had only the dashboard)
        page.click("#view-dash")
    yield page
    page.close()
    assert not errors, errors


def d(page, sel: str, attr: str) -> str:
    return page.get_attribute(sel, f"data-{attr}")


def test_slider_answers_arriving_out_of_order(pg) -> None:
    enter(pg, "Hello world", max_tokens=4)
    pg.wait_for_selector("#dist-table[data-reshaped=true]")
    pg.evaluate(SLOW_FIRST_RESHAPE)
    for t in ("0.3", "1.7"):                         # two quick moves: the first answer is the slow one
        pg.fill("#slider-temperature", t)
        pg.dispatch_event("#slider-temperature", "input")
    pg.wait_for_timeout(1500)
    run = pg.evaluate("() => { const r = window.playground.run, t = r.tokens[r.tokens.length - 1]; return [t.rid, t.index]; }")
    want = pg.evaluate("""async ([rid, index]) => (await (await fetch('/playground/api/reshape', {method: 'POST',
        headers: {'content-type': 'application/json'}, body: JSON.stringify({model: 'tiny', request_id: rid, index,
        params: {...window.playground.sampling}})})).json())""", run)
    shown = pg.eval_on_selector_all("#dist-table tr[data-id]", "rs => rs.map(r => +r.dataset.final)")
    last = want["stages"][-1]["probs"]
    assert shown == pytest.approx(last[: len(shown)], abs=1e-6), "the table shows another temperature's numbers"


def test_ignore_eos_readout_and_its_loop_promise(pg) -> None:
    pg.click("#btn-ignore-eos")                      # moves the temperature slider to 0: its readout too
    assert pg.input_value("#slider-temperature") == "0"
    assert pg.inner_text("#slider-temperature + span") == "0"
    finished(pg)
    assert pg.locator("#cycle, #no-cycle").count() == 1     # panel 4 says what it promised: a loop, or none


def test_end_token_is_explained(pg) -> None:
    enter(pg, "the deploy failed on the", model="trigram", chat=False, trigram=False, max_tokens=60, seed=7)
    plain = gen_ids(pg)
    assert d(pg, "#finish", "reason") == "stop"
    assert pg.locator("#end-token").count() == 1 and int(d(pg, "#end-token", "id")) == plain[-1]
    assert "end-of-generation token" in pg.inner_text("#p-stop")


def test_trigram_with_the_chat_template_ticked(pg) -> None:
    enter(pg, "the deploy failed on the", model="trigram", chat=False, trigram=False, max_tokens=60, seed=7)
    plain = gen_ids(pg)
    enter(pg, "the deploy failed on the", model="trigram", chat=True, trigram=False, max_tokens=60, seed=7)
    assert gen_ids(pg) == plain and len(plain) > 1        # ticked or not, the toy never sees a template


def test_rejections_are_named_and_cleared(pg, server) -> None:  # noqa: F811
    pg.set_checked("#chat", False)
    pg.fill("#prompt", "")
    pg.press("#prompt", "Enter")
    pg.wait_for_selector("#rejected")
    text = pg.inner_text("#break-out")
    assert pg.locator("#overflow").count() == 0 and "context window" not in text and "ValueError" in text
    enter(pg, "Hello world", max_tokens=3, chat=False)
    assert pg.eval_on_selector("#break-out", "n => n.children.length") == 0


def test_replay_after_step_mode_matches(pg) -> None:
    pg.fill("#prompt", "Hello world")
    for n in range(1, 4):
        pg.click("#btn-step")
        pg.wait_for_function(f"() => document.querySelector('#gen-tokens') && JSON.parse(document.querySelector('#gen-tokens').dataset.ids).length === {n}")
        pg.wait_for_function("() => document.querySelector('#btn-pause').disabled")
    stepped = gen_ids(pg)
    pg.click("#btn-replay")
    pg.wait_for_selector("#replay")
    assert d(pg, "#replay", "match") == "true" and gen_ids(pg) == stepped


def test_burst_requests_get_distinct_colours(pg) -> None:
    pg.fill("#burst-n", "6")
    pg.fill("#max_tokens", "6")
    pg.click("#btn-burst")
    pg.wait_for_function("() => new Set(window.playground.eng.steps.flatMap(s => s.batch.map(b => b[0]))).size >= 6",
                         timeout=30000)
    colours = pg.evaluate("""async () => { const u = await import('/util.js');
        const ids = [...new Set(window.playground.eng.steps.flatMap(s => s.batch.map(b => b[0])))].slice(-6);
        return ids.map((id) => u.colourOf(id)); }""")
    hues = sorted(int(re.match(r"hsl\((\d+)", c).group(1)) for c in colours)
    gaps = [b - a for a, b in zip(hues, hues[1:], strict=False)] + [360 - hues[-1] + hues[0]]
    assert min(gaps) >= 8, hues                                   # consecutive ids: 1 degree apart before


def test_no_sideways_scroll_at_420px(server, browser) -> None:  # noqa: F811
    page = browser.new_page(viewport={"width": 420, "height": 900})
    page.goto(server[0] + "/")
    page.wait_for_selector("body[data-ready=true]", timeout=20000)
    enter(page, "Hello world", max_tokens=4)
    for view in ("#view-story", "#view-dash"):
        if page.locator(view).count():
            page.click(view)
            page.wait_for_selector("body[data-inside-ready]:not([data-inside-ready=''])", timeout=20000)
        page.wait_for_timeout(200)
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 420, (view, width)
    page.close()
