"""Story mode and the inside-the-model panels in a real headless Chromium against the real server, and
one browser check per fixed playground bug (each fails on the code before its fix).

Screenshots of every story step land in test-output/story/ (look at them). The server (the tiny llama
model and the trigram toy) is tests/playground/conftest.py's.
"""

from __future__ import annotations

import json

import pytest
import torch

from hitenter.models.trace import trace_forward
from hitenter.testing.paths import TEST_OUTPUT
from hitenter.testing.playground_page import CHROMIUM, enter, finished, gen_ids

STORY_SHOTS = TEST_OUTPUT / "story"
# browser tests: the full suite (CI), not the fast lane
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's /usr/bin/chromium")]
KEYS = ["prompt", "tokens", "ids", "drill_words", "embeddings", "positions", "order", "attention", "layers", "logits", "softmax",
        "drill_softmax", "temperature", "hot", "top_k", "top_p", "draw", "determinism", "loop", "overrule", "prefill", "stops",
        "no_eos", "overflow", "trigram", "batching", "faster", "images", "cheat"]
PANELS = {"tokens": "p-tokens", "drill_words": "p-drill-words", "embeddings": "p-embed", "positions": "p-rope",
          "order": "p-order", "attention": "p-attn", "layers": "p-resid", "logits": "p-logits", "drill_softmax": "p-drill-softmax",
          "temperature": "p-dist", "hot": "p-break", "draw": "p-dice", "determinism": "p-determinism", "loop": "p-loop",
          "overrule": "p-break", "prefill": "p-timeline", "stops": "p-stop", "no_eos": "p-break", "overflow": "p-break",
          "trigram": "p-trigram", "batching": "p-kv", "faster": "p-fast", "images": "p-vision", "cheat": "p-cheat"}


def new_page(browser, server, width: int = 1400):
    pg = browser.new_page(viewport={"width": width, "height": 1000})
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.goto(server[0] + "/")
    pg.wait_for_selector("body[data-ready=true]", timeout=20000)
    return pg


def d(pg, sel: str, attr: str) -> str:
    return pg.get_attribute(sel, f"data-{attr}")


def check_step(pg, key: str, eng, ref) -> None:
    """One story step's live panel, against hitenter/models/trace.py run here on the same engine's model."""
    ids = ref.token_ids if ref is not None else []
    if key == "embeddings":
        pg.locator("#p-embed .tracetoks .tok").nth(3).click()
        pg.wait_for_selector("#embedding[data-index='3']")
        assert json.loads(d(pg, "#embedding", "nearest"))[0] == ids[3]
        assert float(d(pg, "#embedding", "norm")) == pytest.approx(float(ref.embeddings[3].norm()), rel=1e-3)
    elif key == "positions":
        assert int(d(pg, "#rope", "pairs")) == eng.model_config.head_dim // 2
    elif key == "attention" and len(ids) > 2:
        if pg.locator("#attn-fold").count() and pg.is_checked("#attn-fold"):
            pg.click("#attn-fold")                        # every key column, the template's too
        pg.wait_for_selector("#attn-heat[data-from='0']")
        pg.click("#attn-heads button[data-head='1']")
        pg.locator("#attn-layer").fill("1")
        pg.dispatch_event("#attn-layer", "change")
        pg.wait_for_selector("#attn-heat[data-layer='1'][data-head='1']")
        q = len(ids) - 2
        pg.hover(f"#attn-heat .qlab[data-q='{q}']")
        pg.wait_for_selector(f"#attn-focus[data-q='{q}']")
        row = pg.eval_on_selector_all(f"#attn-heat .cell[data-q='{q}']", "cs => cs.map(c => +c.dataset.p)")
        torch.testing.assert_close(torch.tensor(row), ref.attentions[1, 1, q], atol=1e-4, rtol=0)
        assert int(d(pg, "#attn-focus", "top")) == int(ref.attentions[1, 1, q].argmax())
        pg.click("#btn-compare")                          # the tiny vocabulary has no " bank": a clear refusal
        pg.wait_for_selector("#compare, #compare-error")
    elif key == "layers":
        assert len(json.loads(d(pg, "#resid-norms", "norms"))) == eng.model_config.num_layers + 1
        assert pg.locator("#lens tr[data-layer]").count() == eng.model_config.num_layers + 1
        top = int(pg.get_attribute(f"#lens tr[data-layer='{eng.model_config.num_layers}']", "data-top"))
        assert top == int(ref.logits[-1].argmax())
    elif key == "softmax":
        pg.locator("#logit-temp").fill("0.5")
        pg.wait_for_selector("#logits[data-temperature='0.5']")
        assert pg.inner_text("#logit-temp-value") == "0.5"
        first = float(pg.get_attribute("#logits tr[data-id]", "data-logit"))
        assert first == pytest.approx(float(ref.logits[-1].max()), abs=1e-3)
    elif key == "batching":
        pg.click("#btn-burst")
        pg.wait_for_function("() => [...document.querySelectorAll('#batchstrip .batchcol')].some(c => +c.dataset.size >= 2)")


def walk_story(pg, eng) -> None:
    STORY_SHOTS.mkdir(parents=True, exist_ok=True)
    ref = None
    for i, key in enumerate(KEYS):
        pg.wait_for_selector(f"#story[data-step='{key}']")
        if key in PANELS:
            assert pg.locator(f"#story-panels > #{PANELS[key]}").count() == 1, key
        if key == "ids":
            ref = trace_forward(eng.runner.model, json.loads(d(pg, "#story-ids", "ids")))
        check_step(pg, key, eng, ref)
        pg.screenshot(path=str(STORY_SHOTS / f"{i + 1:02d}-{key}.png"))
        if i < len(KEYS) - 1:
            pg.click("#story-next")
    assert pg.is_disabled("#story-next")


def test_story_walks_prompt_to_batching(browser, server) -> None:
    pg = new_page(browser, server)
    pg.fill("#prompt", "the deploy failed on the")
    pg.press("#prompt", "Enter")
    finished(pg)
    pg.wait_for_function("() => document.body.dataset.insideReady")
    walk_story(pg, server[1]["tiny"])
    pg.click("#view-dash")
    assert pg.is_visible("#p-attn") and pg.is_visible("#p-fast") and pg.is_hidden("#story")
    assert float(d(pg, "#fast", "bandwidth")) > 0 and int(d(pg, "#fast", "weight-bytes")) > 0
    pg.screenshot(path=str(STORY_SHOTS / "dashboard.png"), full_page=True)
    pg.click("#view-story")
    assert pg.is_visible("#story") and pg.is_hidden("main")
    assert not pg.errors, pg.errors
    pg.close()


def test_logits_temperature_and_draw_share_one_pinned_step(browser, server) -> None:
    """The logits step showed step 0's distribution and the temperature step the last step's."""
    pg = new_page(browser, server)
    enter(pg, "the deploy failed on the", max_tokens=6, seed=5)
    pg.wait_for_function("() => document.body.dataset.insideReady")
    pg.click("#story-rail li[data-key='logits']")
    pg.wait_for_selector("#logits-step[data-step='0']")
    lp = dict(pg.eval_on_selector_all("#logits tr[data-id]", "rs => rs.map(r => [+r.dataset.id, +r.dataset.p])"))
    pg.click("#story-rail li[data-key='temperature']")
    pg.wait_for_selector("#dist-table[data-step='0']")
    raw = pg.eval_on_selector_all("#dist-table tr[data-id]", "rs => rs.map(r => [+r.dataset.id, +r.dataset.raw])")
    both = [(t, p) for t, p in raw if t in lp]
    assert len(both) >= 3 and all(abs(lp[t] - p) < 2e-3 for t, p in both), (lp, raw)
    assert "pinned" in pg.inner_text("#p-dist")
    pg.click("#story-rail li[data-key='draw']")
    pg.wait_for_selector("#dice-step[data-step='0']")
    assert int(d(pg, "#dice", "token")) == gen_ids(pg)[0]
    pg.click("#view-dash")                                          # the dashboard follows the latest step again
    pg.wait_for_selector(f"#dist-table[data-step='{len(gen_ids(pg)) - 1}']")
    assert not pg.errors, pg.errors
    pg.close()
