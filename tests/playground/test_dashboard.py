"""The playground page in a real headless Chromium against the real server, with the engine as the oracle.

Screenshots of every panel land in test-output/playground/ (look at them). Skipped only when
/usr/bin/chromium is absent. Assertions read data-* attributes and compare with the engine.
"""

from __future__ import annotations

import json
import math
import time

import pytest

from hitenter.testing.paths import TEST_OUTPUT
from hitenter.testing.playground_page import CHROMIUM, TINY_OPTS, data, enter, finished, gen_ids

SHOTS = TEST_OUTPUT / "playground"
pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's /usr/bin/chromium"),
              pytest.mark.slow]     # a browser (conftest: one for these modules): the fast lane skips it


@pytest.fixture
def page(server, browser):
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(server[0] + "/")
    pg.wait_for_selector("body[data-ready=true]", timeout=20000)
    pg.click("#view-dash")                 # the page opens in story mode; these tests use the dashboard
    yield pg
    pg.close()
    assert not errors, errors


def shot(pg, panel: str, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg.locator(f"#{panel}").screenshot(path=str(SHOTS / f"{name}.png"))


def oracle(tiny_llama_path, prompt_ids, **params):
    """The same request on a second engine built the same way: ids and finish reason."""
    from hitenter.engine.llm_engine import LLMEngine
    from hitenter.sampling_params import SamplingParams

    eng = LLMEngine(str(tiny_llama_path), **TINY_OPTS)
    rid = eng.add_request(None, prompt_ids, SamplingParams(**params))
    while True:
        for out in eng.step():
            if out.request_id == rid and out.finished:
                return out.token_ids, out.finish_reason


def test_tokens_panel_shows_the_engines_prompt_ids(page, server) -> None:
    tok = server[1]["tiny"].tokenizer
    enter(page, "Hello world, hello tokens")
    want = tok.apply_chat_template([{"role": "user", "content": "Hello world, hello tokens"}], tokenize=True)
    assert json.loads(data(page, "#prompt-tokens", "ids")) == list(want)
    assert data(page, "#prompt-tokens", "source") == "engine"
    chips = [int(x) for x in page.eval_on_selector_all("#prompt-tokens .tok", "els => els.map(e => e.dataset.id)")]
    assert chips == list(want)
    assert page.locator("#prompt-tokens .tok.special").count() == sum(tok.is_special(t) for t in want)
    assert int(data(page, "#ctx-count", "ctx")) == server[1]["tiny"].max_model_len
    shot(page, "p-tokens", "01-tokens")


def test_generation_matches_an_engine_oracle_and_replays(page, server, tiny_llama_path) -> None:
    enter(page, "Hello world", max_tokens=10, seed=11)
    prompt = json.loads(data(page, "#prompt-tokens", "ids"))
    ids, reason = oracle(tiny_llama_path, prompt, temperature=0.8, seed=11, max_tokens=10)
    assert gen_ids(page) == ids and data(page, "#finish", "reason") == reason
    assert data(page, "#dice", "method") == "exponential_race" and data(page, "#dice", "seed") == "11"
    page.click("#btn-replay")
    page.wait_for_selector("#replay")
    finished(page)
    assert data(page, "#replay", "match") == "true" and gen_ids(page) == ids
    shot(page, "p-dice", "03-dice")
    shot(page, "p-loop", "04-loop")
    shot(page, "p-stop", "08-stopping")
    shot(page, "p-inspector", "12-inspector")
    req = json.loads(page.inner_text("#inspector-json"))
    assert req["model"] == "tiny" and req["seed"] == 11 and req["max_tokens"] == 10
    assert len(page.inner_text("#inspector-trace").splitlines()) == int(data(page, "#timeline", "steps"))


def test_sliders_reshape_cached_logits_without_a_model_run(page, server) -> None:
    enter(page, "Hello world", max_tokens=4)
    page.wait_for_selector("#dist-table[data-reshaped=true]")
    steps = server[1]["tiny"].step_counter
    page.fill("#slider-top_k", "3")
    page.dispatch_event("#slider-top_k", "input")
    page.wait_for_function("() => document.querySelector('#dist-table').dataset.kept === '3'")
    kept = page.eval_on_selector_all("#dist-table tr[data-id]", "rs => rs.map(r => r.dataset.kept)")
    assert kept.count("true") == 3 and page.locator("#dist-table tr.cut").count() == len(kept) - 3
    raw, final = float(data(page, "#entropy", "raw")), float(data(page, "#entropy", "final"))
    assert final <= raw + 1e-9 and final <= math.log2(3) + 1e-6
    assert server[1]["tiny"].step_counter == steps          # re-shaping ran no engine step
    shot(page, "p-dist", "02-distribution")


def test_stop_string_spanning_tokens(page, server, tiny_llama_path) -> None:
    tok = server[1]["tiny"].tokenizer
    for seed in range(3, 20):               # a 2-token stretch without newlines (an <input> holds one line)
        enter(page, "Hello world", max_tokens=12, seed=seed)
        ids = gen_ids(page)
        spans = [tok.decode(ids[i:i + 2]) for i in range(1, len(ids) - 1)]
        spans = [s for s in spans if "\n" not in s and s.strip() and len(s) >= 2]
        if spans:
            break
    stop = spans[0]
    enter(page, "Hello world", max_tokens=12, seed=seed, stop=stop)
    assert data(page, "#finish", "reason") == "stop" and data(page, "#finish", "stop") == stop
    first, last = int(data(page, "#stop-span", "first")), int(data(page, "#stop-span", "last"))
    assert first <= last and stop not in page.inner_text("#gen-text").split("⟨")[0]
    shot(page, "p-stop", "08-stop-string")


def test_timeline_prefill_chunks_then_decodes(page, server) -> None:
    enter(page, "a longer prompt that the scheduler has to split into chunks of sixteen tokens", max_tokens=6)
    n_prompt = len(json.loads(data(page, "#prompt-tokens", "ids")))
    bars = page.eval_on_selector_all("#timeline .tl-bar", "bs => bs.map(b => ({...b.dataset}))")
    kinds = [b["kind"] for b in bars]
    cached = int(data(page, "#timeline", "cached"))              # earlier tests' blocks: a prefix-cache hit
    assert cached % 4 == 0 and kinds.count("prefill") == math.ceil((n_prompt - cached) / 16) >= 2
    assert kinds == sorted(kinds, key=lambda k: k != "prefill") and kinds.count("decode") == 5
    assert sum(int(b["tokens"]) for b in bars if b["kind"] == "prefill") == n_prompt - cached
    starts, ends = [float(b["start"]) for b in bars], [float(b["end"]) for b in bars]
    assert all(s < e for s, e in zip(starts, ends, strict=True)) and all(e <= s for e, s in zip(ends, starts[1:], strict=False))
    prefill_time = sum(e - s for e, s, k in zip(ends, starts, kinds, strict=True) if k == "prefill")
    assert float(data(page, "#timeline", "ttft")) >= 0.9 * prefill_time
    assert float(data(page, "#tbt", "mean")) > 0
    shot(page, "p-timeline", "06-timeline")


def test_block_map_equals_the_engines_kv_state(page, server) -> None:
    eng = server[1]["tiny"]
    enter(page, "Hello world", max_tokens=8)
    # the engine's own bytes per token: K and V of every layer in the cache's elements (f16 by default: 256)
    per_token = eng.parts.model.config.kv_bytes_per_token(eng.parts.runner.kv_caches[0].element_size())
    assert per_token == eng.plan.kv_bytes_per_token in (256, 512)
    assert int(data(page, "#req-kv", "bytes")) == int(data(page, "#req-kv", "tokens")) * per_token
    assert int(data(page, "#req-kv", "blocks")) == math.ceil(int(data(page, "#req-kv", "tokens")) / 4)
    page.fill("#max_tokens", "70")              # 6 x (prompt + 70..90 tokens) > 64 blocks: preemptions
    page.fill("#burst-n", "6")
    real_step = eng.step

    def slow_step():  # the tiny model can finish the whole burst before the page has drawn a busy map
        time.sleep(0.02)
        return real_step()

    eng.step = slow_step
    try:
        page.click("#btn-burst")
        page.wait_for_function("() => [...document.querySelectorAll('#batchstrip .batchcol')]"
                               ".some(c => +c.dataset.size >= 4)")
        page.wait_for_function("() => +document.querySelector('#kv-summary').dataset.free < 40")
        shot(page, "p-kv", "07-kv-busy")
    finally:
        del eng.step   # the class's step again
    deadline = time.time() + 60
    while eng.has_unfinished_requests() and time.time() < deadline:
        time.sleep(0.2)
    want = {b.block_id: (b.ref_cnt, ",".join(b.owners), b.hashed) for b in eng.kv_manager.snapshot()}
    page.wait_for_function(f"() => document.querySelector('#kv-summary').dataset.step === '{eng.step_counter}'")
    got = page.eval_on_selector_all("#blockmap .blk", "bs => bs.map(b => [b.dataset.blockId, b.dataset.ref, b.dataset.owners, b.dataset.hashed])")
    assert {int(i): (int(r), o, h == "true") for i, r, o, h in got} == want
    assert int(data(page, "#kv-summary", "free")) == eng.kv_manager.num_free_blocks
    shot(page, "p-kv", "07-kv-idle")


def test_overflow_is_rejected_with_zero_engine_steps(page, server) -> None:
    """The break-it overflows this model's own window (one token over), and /v1/completions says 400 too."""
    before = server[1]["tiny"].step_counter
    page.click("#btn-overflow")
    page.wait_for_selector("#v1-overflow")
    assert data(page, "#overflow", "steps-before") == data(page, "#overflow", "steps-after")
    n_prompt, max_tokens = int(data(page, "#overflow", "n-prompt")), int(data(page, "#overflow", "max-tokens"))
    assert int(data(page, "#overflow", "n-ctx")) == 128 == server[1]["tiny"].max_model_len
    assert n_prompt + max_tokens == 129 and max_tokens == int(page.input_value("#max_tokens"))
    assert data(page, "#v1-overflow", "status") == "400" and str(n_prompt) in page.inner_text("#v1-overflow")
    assert server[1]["tiny"].step_counter == before
    assert data(page, "#timeline-empty", "steps") == "0"
    assert "rejected" in page.inner_text("#finish") and "running" not in page.inner_text("#p-stop")
    shot(page, "p-break", "09-overflow")


def test_ignore_eos_runs_to_the_budget(page, server) -> None:
    page.click("#btn-ignore-eos")
    page.wait_for_selector("#eos-compare", timeout=30000)
    ids = json.loads(data(page, "#eos-after", "ids"))
    assert data(page, "#eos-after", "finish") == "length" and len(ids) == 40
    before = json.loads(data(page, "#eos-before", "ids"))
    assert data(page, "#eos-before", "finish") in ("stop", "length") and len(before) <= 40
    assert before[:-1] == ids[: len(before) - 1]     # greedy: the same tokens until the end token stops it
    shot(page, "p-break", "09-ignore-eos")


def test_branching_reuses_the_prefix_blocks(page, server) -> None:
    enter(page, "Hello world", max_tokens=10)
    page.locator("#gen-tokens .tok").nth(3).click()
    alt = page.locator("#branch-menu button:not([disabled])").first
    alt_id = int(alt.get_attribute("data-id"))
    alt.click()
    page.wait_for_function("() => { const b = document.querySelector('#branch-info'); return b && b.dataset.cached !== ''; }")
    cached, prefix = int(data(page, "#branch-info", "cached")), int(data(page, "#branch-info", "prefix"))
    assert cached > 0 and cached % 4 == 0 and cached <= prefix - 1       # whole blocks, never the last token
    assert int(page.locator("#branch-new .tok").first.get_attribute("data-id")) == alt_id
    shot(page, "p-branch", "05-branching")


def test_step_mode_one_token_per_request(page, server) -> None:
    page.fill("#prompt", "Hello world")
    for n in range(1, 4):
        page.click("#btn-step")
        page.wait_for_function(f"() => document.querySelector('#gen-tokens') && JSON.parse(document.querySelector('#gen-tokens').dataset.ids).length === {n}")
        page.wait_for_function("() => document.querySelector('#btn-pause').disabled")
    status = page.inner_text("#status")      # each step is the Enter request again, max_tokens = n: its prompt is cached
    assert "the Enter request with max_tokens = 3" in status
    cached = int(status.split(": ")[-1].split(" tokens from the prefix cache")[0])
    assert cached == page.evaluate("() => window.playground.run.cached") and cached > 0


def pick_first_trigram_step(pg) -> None:
    """Click the first trigram step until the page shows it chosen: a redraw between finding the element
    and the click can leave the click on a detached copy (the page redraws its panels as events arrive)."""
    chosen = "#trigram-tokens .tok.chosen-branch[data-index='0']"
    for _ in range(10):
        pg.locator("#trigram-tokens .tok").first.click()
        try:
            pg.wait_for_selector(chosen, timeout=3000)
            return
        except Exception:   # playwright's TimeoutError: click again on the redrawn element
            continue
    pg.wait_for_selector(chosen)


def test_trigram_beside_the_real_model(page, server) -> None:
    model = server[1]["trigram"].parts.model
    tok = server[1]["trigram"].tokenizer
    enter(page, "the disk is", trigram=True, max_tokens=6)
    page.wait_for_selector("#trigram-lookup")
    page.wait_for_timeout(500)
    ids = tok.encode("the disk is")
    pick_first_trigram_step(page)
    pair = json.loads(data(page, "#trigram-lookup", "pair"))
    assert pair == ids[-2:]
    assert json.loads(data(page, "#trigram-lookup", "counts")) == [list(c) for c in model.lookup(*pair)["counts"]]
    shot(page, "p-trigram", "11-trigram")
    enter(page, "zebra quantum", model="trigram", chat=False, trigram=False, max_tokens=3)
    pick_first_trigram_step(page)
    ids = tok.encode("zebra quantum")
    assert json.loads(data(page, "#trigram-lookup", "pair")) == ids[-2:]
    assert data(page, "#trigram-lookup", "seen") == "false" and data(page, "#trigram-lookup", "counts") == "[]"
    shot(page, "p-trigram", "11-trigram-unseen")


def test_determinism_alone_vs_loaded(page, server) -> None:
    page.fill("#det-n", "3")
    page.click("#btn-det")
    page.wait_for_selector("#det-result", timeout=60000)
    assert data(page, "#det-result", "same-ids") == "true"
    shot(page, "p-determinism", "10-determinism")
