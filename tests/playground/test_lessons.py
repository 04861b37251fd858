"""The three lessons the playground once taught wrong, checked without a browser on the tiny model (and with one
for the determinism panel's temperature): the "bank" pair puts the clue before the word, the determinism
check runs at the learner's temperature with a comparison that can show a flip (its numbers against a plain
torch GEMM computed here), heads are labelled from the trace (tests/playground/test_api.py checks the kinds)."""

from __future__ import annotations

import json

import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient

from hitenter.engine.async_engine import AsyncLLMEngine
from hitenter.engine.llm_engine import LLMEngine
from hitenter.models.trace import trace_forward
from hitenter.server.playground import make_playground_router
from hitenter.server.playground_models import CompareBody
from hitenter.testing.playground_page import CHROMIUM, TINY_OPTS, enter


@pytest.fixture(scope="module")
def client(tiny_llama_path):
    eng = LLMEngine(str(tiny_llama_path), **TINY_OPTS)
    app = FastAPI()
    app.include_router(make_playground_router({"tiny": AsyncLLMEngine(eng)}))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c, eng


def test_the_bank_pair_puts_the_clue_before_the_word() -> None:
    b = CompareBody()
    for sentence in (b.a, b.b):
        assert sentence.split()[-1] == b.word, sentence      # a causal model sees only what came before the word
    assert b.b == "we sat on the river bank"                # the article's own sentence


@pytest.mark.slow          # two traced forwards and dense GEMMs per step on the tiny model: ~3 s
def test_determinism_arithmetic_can_show_a_flip(client) -> None:
    c, eng = client
    model = eng.runner.model
    prompt = eng.tokenizer.encode("the cache is warm and the deploy")
    answer = eng.tokenizer.encode(" failed on the")[:3]
    r = c.post("/playground/api/determinism/arithmetic",
               json={"model": "tiny", "text": "the cache is warm and the deploy", "chat": False, "answer": answer, "others": 3})
    assert r.status_code == 200, r.text
    out = r.json()
    steps = out["steps"]
    assert len(steps) == len(answer) + 1 and steps[-1]["near_tie"] and not any(s["near_tie"] for s in steps[:-1])
    tr = trace_forward(model, prompt + answer)
    rows = tr.final_normed[len(prompt) - 1 : len(prompt) - 1 + len(answer)]
    eye = torch.eye(model.head.in_features, dtype=model.dtype)
    head = (model.head(eye) - model.head(torch.zeros_like(eye))).float().t()      # the head's weights, read back
    for s, row in zip(steps, rows, strict=False):
        assert s["engine"]["bits_differ"] == 0 and not s["engine"]["flip"]       # this server: batch invariant
        alone = torch.nn.functional.linear(row[None].float(), head)[0]              # the plain GEMM, recomputed here
        top = alone.topk(2)
        assert s["plain"]["top_alone"] == int(top.indices[0])
        assert s["plain"]["margin"] == pytest.approx(float(top.values[0] - top.values[1]), abs=1e-5)
        for k in ("engine", "plain"):
            assert s[k]["flip"] == (s[k]["top_alone"] != s[k]["top_batched"])
    assert steps[-1]["plain"]["margin"] < 1e-4                     # the built near tie is within rounding
    bad = c.post("/playground/api/determinism/arithmetic", json={"model": "tiny", "text": "x", "answer": []})
    assert bad.status_code == 400


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's /usr/bin/chromium")
def test_determinism_runs_at_the_learners_temperature(server, browser) -> None:
    """Temperature 0 was sent as 0.8 (`temperature || 0.8`): greedy was never checked."""
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    pg.goto(server[0] + "/")
    pg.wait_for_selector("body[data-ready=true]", timeout=20000)
    pg.click("#view-dash")
    enter(pg, "the deploy failed on the", max_tokens=5)
    pg.locator("#slider-temperature").fill("0")
    pg.dispatch_event("#slider-temperature", "input")
    with pg.expect_request(lambda r: r.url.endswith("/determinism")) as req:
        pg.fill("#det-n", "2")
        pg.click("#btn-det")
    assert json.loads(req.value.post_data)["params"]["temperature"] == 0
    pg.wait_for_selector("#det-arith", timeout=120000)
    assert pg.get_attribute("#det-result", "data-same-ids") == "true"
    assert "temperature 0 (greedy)" in pg.inner_text("#det-result")
    assert int(pg.get_attribute("#det-arith", "data-engine-differ")) == 0
    pg.close()


def test_ffn_view_adds_up_to_the_traced_layer(client) -> None:
    """The norm and feed-forward view of one token: x + attention + the block = the traced stream after the
    layer (the engine's own layer forward), the norm's output rms that of mid / rms(mid) * weight."""
    c, eng = client
    s = c.post("/playground/api/trace", json={"model": "tiny", "text": "the bank by the river", "chat": False}).json()
    i = len(s["pieces"]) - 1
    for layer in range(s["layers"]):
        r = c.post("/playground/api/trace/ffn", json={"trace_id": s["trace_id"], "index": i, "layer": layer})
        assert r.status_code == 200, r.text
        f = r.json()
        assert f["error"] < 1e-3 * max(1.0, f["mid_norm"]), f["error"]
        assert f["ffn_dim"] == eng.model_config.intermediate_size and 0 < f["fire_share"] <= 1
        assert len(f["top"]) == min(16, f["ffn_dim"]) and abs(f["top"][0]["a"]) == max(abs(t["a"]) for t in f["top"])
        w = eng.runner.model.layers[layer].ffn_norm.weight.float()
        assert f["norm"]["weight"]["mean"] == pytest.approx(float(w.mean()), abs=1e-5)
    bad = c.post("/playground/api/trace/ffn", json={"trace_id": s["trace_id"], "index": i, "layer": 99})
    assert bad.status_code == 400
