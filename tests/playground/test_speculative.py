"""Making it faster, speculative decoding on and off: POST /playground/api/speculative decodes the prompt with the
request opted out of speculation, then with it on, and the page's control shows both: identical token ids, the
steps each took and the speedup on the engine's own step clock. A model served without speculation is a 400
naming --speculative-method ngram, and the page says so instead of offering the button.

API: the tiny random llama with n-gram speculation beside one without. Browser: SmolLM2 (real weights) with
n-gram speculation beside the same file without, in Debian's Chromium."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hitenter.testing.live_server import live_server
from hitenter.testing.paths import TEST_OUTPUT
from hitenter.testing.playground_page import CHROMIUM, TINY_OPTS

SMOLLM2 = Path.home() / ".cache" / "hitenter" / "models" / "smollm2-135m-instruct.gguf"
# a prompt whose greedy answer copies earlier text, so prompt lookup finds drafts the model accepts
COPY = "Repeat this list three times: apples, pears, plums, figs, limes, dates."


def _serve(engines: dict[str, Any]) -> Iterator[str]:
    from hitenter.server.api import create_app

    first, *rest = engines
    app = create_app(engines[first], first, extra_engines={n: engines[n] for n in rest})
    with live_server(app) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def tiny(tiny_llama_path) -> Iterator[str]:
    from hitenter.engine.llm_engine import LLMEngine

    yield from _serve({"spec": LLMEngine(str(tiny_llama_path), speculative_method="ngram", **TINY_OPTS),
                       "plain": LLMEngine(str(tiny_llama_path), **TINY_OPTS)})


def _post(base: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base}/playground/api/speculative", json=body, timeout=120)


def _check_accounting(r: dict[str, Any]) -> None:
    """What any answer must satisfy: same ids, one step per token off, accepted drafts save steps on."""
    off, on = r["off"], r["on"]
    assert r["same_ids"] and off["ids"] == on["ids"] and len(on["ids"]) == r["tokens"]
    assert off["spec"]["num_draft_tokens"] == 0 and off["spec"]["num_verify_steps"] == 0    # opted out
    assert off["steps"] == r["tokens"] and off["tokens_per_step"] == pytest.approx(1.0)
    assert on["steps"] == r["tokens"] - on["spec"]["num_accepted_tokens"]                  # each accepted draft saves a step
    assert r["speedup"] == pytest.approx(off["decode_s"] / on["decode_s"])
    assert r["speedup"] == pytest.approx(on["tokens_per_s"] / off["tokens_per_s"])
    assert len(r["round_s"]) == r["rounds"] and min(a for a, _ in r["round_s"]) == pytest.approx(off["decode_s"])


def test_api_runs_the_prompt_both_ways(tiny: str) -> None:
    r = _post(tiny, {"model": "spec", "text": "a b c a b c a b", "chat": False, "tokens": 24, "rounds": 2})
    assert r.status_code == 200, r.text
    got = r.json()
    _check_accounting(got)
    assert got["spec"]["method"] == "ngram" and got["on"]["spec"]["num_verify_steps"] >= 0
    # seeded sampling: the same draws with and without speculation
    seeded = _post(tiny, {"model": "spec", "text": "a b c a b c", "chat": False, "tokens": 16, "rounds": 1,
                          "params": {"temperature": 0.9, "seed": 5}}).json()
    _check_accounting(seeded)


def test_api_refuses_clearly(tiny: str) -> None:
    r = _post(tiny, {"model": "plain", "text": "hello"})
    assert r.status_code == 400 and "--speculative-method ngram" in r.json()["error"]["message"]
    for bad in ({"tokens": 1}, {"tokens": 257}, {"rounds": 0}, {"tokens": "8"}, {"params": {"temperature": 5}}):
        r = _post(tiny, {"model": "spec", "text": "hello", **bad})
        assert r.status_code == 400, (bad, r.text)
    r = _post(tiny, {"model": "spec", "text": "x " * 200, "chat": False})        # fills the 128-token window
    assert r.status_code == 400 and "no room" in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def real() -> Iterator[str]:
    if not SMOLLM2.exists():
        pytest.skip(f"not cached: {SMOLLM2}")
    from hitenter.engine.llm_engine import LLMEngine

    opts = dict(max_model_len=512, kv_cache_memory=1 << 26)
    yield from _serve({"smollm2-spec": LLMEngine(str(SMOLLM2), speculative_method="ngram", **opts),
                       "smollm2": LLMEngine(str(SMOLLM2), **opts)})


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's /usr/bin/chromium")
def test_page_shows_identical_output_and_the_speedup(real: str, browser) -> None:
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.goto(real + "/")
    pg.wait_for_selector("body[data-ready=true]", timeout=30000)
    pg.click("#view-dash")
    pg.select_option("#model", "smollm2")                    # served without speculation: said, with how to start it
    pg.wait_for_selector("#fast-spec[data-on='false']")
    assert "--speculative-method ngram" in pg.inner_text("#fast-spec") and pg.locator("#btn-spec").count() == 0
    pg.select_option("#model", "smollm2-spec")
    pg.wait_for_selector("#fast-spec[data-on='true']")
    pg.fill("#prompt", COPY)
    pg.fill("#spec-tokens", "48")
    pg.click("#btn-spec")
    pg.wait_for_selector("#spec-compare", timeout=180000)
    d = lambda a: pg.get_attribute("#spec-compare", f"data-{a}")     # noqa: E731
    assert d("same") == "true" and d("tokens") == "48"
    drafted, accepted = int(d("drafted")), int(d("accepted"))
    assert drafted > 0 and accepted > 0                                 # the copy is found and accepted
    assert int(d("steps-off")) == 48 and int(d("steps-on")) == 48 - accepted
    assert float(d("speedup")) == pytest.approx(float(d("tps-on")) / float(d("tps-off")), rel=1e-6)
    assert f"{float(d('speedup')):.2f}×" == pg.inner_text("#spec-speedup")
    assert pg.input_value("#spec-tokens") == "48"                      # kept across redraws
    pg.locator("#p-fast").screenshot(path=str(TEST_OUTPUT / "speculative-on-off.png"))
    pg.close()
    assert not errors, errors
