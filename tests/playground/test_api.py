"""The playground API without a browser: bodies validated (400, never 500), bounds, and the trace routes
on the tiny model (their numbers against hitenter/models/trace.py directly)."""

from __future__ import annotations

import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient

from hitenter.engine.async_engine import AsyncLLMEngine
from hitenter.engine.llm_engine import LLMEngine
from hitenter.models.trace import embedding_table, trace_forward
from hitenter.server.playground import make_playground_router

OPTS = dict(kv_cache_memory=64 * 4 * 512, block_size=4, max_model_len=128, max_num_batched_tokens=16)


@pytest.fixture(scope="module")
def client(tiny_llama_path):
    eng = LLMEngine(str(tiny_llama_path), **OPTS)
    tri = LLMEngine("trigram", kv_cache_memory=1 << 16, block_size=4)
    engines = {"tiny": AsyncLLMEngine(eng), "trigram": AsyncLLMEngine(tri)}
    app = FastAPI()
    app.include_router(make_playground_router(engines))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c, eng


@pytest.mark.parametrize("path,body", [
    ("/burst", {"model": "tiny", "n": "abc"}),
    ("/burst", {"model": "tiny", "n": 10_000}),
    ("/reshape", {"model": "tiny", "request_id": "x", "index": "abc"}),
    ("/generate", {"model": "tiny", "prompt_ids": [10**9]}),
    ("/generate", {"model": "tiny", "text": "hi", "params": {"max_tokens": "many"}}),
    ("/generate", {"model": "tiny", "text": "hi", "params": {"max_tokens": 10**6}}),
    ("/generate", {"model": "tiny", "text": "hi", "params": {"temperature": -1}}),
    ("/determinism", {"model": "tiny", "others": 99}),
    ("/tokenize", {"model": "tiny", "text": "x" * 100_000}),
    ("/trace", {"model": "tiny", "text": "hi", "generate": "x"}),
    ("/trace", {"model": "tiny", "text": "word " * 200, "chat": False}),
    ("/trace", {"model": "trigram", "text": "hi"}),
    ("/trace/attention", {"trace_id": 5}),
    ("/trace/rope", {"model": "tiny", "positions": -3}),
])
def test_bad_bodies_are_400(client, path: str, body: object) -> None:
    c, _ = client
    r = c.post("/playground/api" + path, json=body)
    assert r.status_code == 400, (r.status_code, r.text)
    assert r.json()["detail"]


def test_not_json_and_not_an_object_are_400(client) -> None:
    c, _ = client
    assert c.post("/playground/api/burst", content=b"{nope", headers={"content-type": "application/json"}).status_code == 400
    assert c.post("/playground/api/burst", json=[1, 2]).status_code == 400


def test_trace_routes_draw_the_models_own_numbers(client) -> None:
    c, eng = client
    r = c.post("/playground/api/trace", json={"model": "tiny", "text": "the bank by the river", "chat": False})
    assert r.status_code == 200, r.text
    s = r.json()
    ids = [p["id"] for p in s["pieces"]]
    ref = trace_forward(eng.runner.model, ids)
    assert len(s["norms"]) == s["layers"] + 1 and len(s["norms"][0]) == len(ids)
    att = c.post("/playground/api/trace/attention", json={"trace_id": s["trace_id"], "layer": 1}).json()
    torch.testing.assert_close(torch.tensor(att["probs"]), ref.attentions[1], atol=1e-4, rtol=0)
    emb = c.post("/playground/api/trace/embedding", json={"trace_id": s["trace_id"], "index": 2}).json()
    assert emb["nearest"][0]["piece"]["id"] == ids[2] and abs(emb["nearest"][0]["cos"] - 1) < 1e-4
    lens = c.post("/playground/api/trace/lens", json={"trace_id": s["trace_id"], "index": len(ids) - 1}).json()
    assert lens["top"][-1][0]["piece"]["id"] == int(ref.logits[-1].argmax())
    lg = c.post("/playground/api/trace/logits", json={"trace_id": s["trace_id"], "index": len(ids) - 1,
                                                       "temperature": 0.5}).json()
    assert lg["rows"][0]["logit"] == pytest.approx(float(ref.logits[-1].max()), abs=1e-4)
    assert c.post("/playground/api/trace/lens", json={"trace_id": s["trace_id"], "index": 999}).status_code == 400
    rope = c.post("/playground/api/trace/rope", json={"model": "tiny", "positions": 4, "max_distance": 8}).json()
    assert rope["decay"][0] == pytest.approx(1.0) and len(rope["angles"]) == 4
    fast = c.get("/playground/api/fast", params={"model": "tiny"}).json()
    assert fast["weight_bytes"] > 0 and fast["bandwidth"] > 0 and fast["key_tile"] > 0


def test_get_routes_without_a_model_are_404_not_422(client) -> None:
    c, _ = client
    for path in ("/kv", "/fast", "/events"):
        assert c.get("/playground/api" + path).status_code == 404


def sse_events(c, body: dict) -> list[dict]:
    import json

    with c.stream("POST", "/playground/api/generate", json=body) as r:
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def test_speculative_steps_show_their_accepted_tokens(tiny_llama_path) -> None:
    eng = LLMEngine(str(tiny_llama_path), speculative_method="ngram", num_speculative_tokens=3, **OPTS)
    app = FastAPI()
    app.include_router(make_playground_router({"spec": AsyncLLMEngine(eng)}))
    with TestClient(app) as c:
        fast = c.get("/playground/api/fast", params={"model": "spec"}).json()
        assert fast["spec"] == {"method": "ngram", "k": 3}
        ids = [5, 70, 100, 33, 5, 70, 100, 33, 5, 70, 100, 33, 5, 70]
        evs = sse_events(c, {"model": "spec", "prompt_ids": ids, "params": {"temperature": 0, "max_tokens": 24,
                                                                             "ignore_eos": True}})
        st = c.get("/playground/api/fast", params={"model": "spec"}).json()["spec_stats"]
    steps = [e for e in evs if e["type"] == "step" and e.get("token")]
    out = [e for e in evs if e["type"] == "output"][-1]
    shown = [t["id"] for s in steps for t in [s["token"], *s["more"]]]
    assert shown == out["token_ids"] and sum(s["accepted"] for s in steps) == len(out["token_ids"])
    assert max(s["accepted"] for s in steps) > 1          # some step emitted drafted tokens the model accepted
    drafted = sum(s["accepted"] - 1 for s in steps)       # the accepted drafts of this request, as the steps showed them
    assert st["accepted_tokens"] == drafted and st["draft_tokens"] >= drafted and st["drafts"] > 0


def test_fast_facts_are_the_models(client) -> None:
    """Sizes and the KV formula from the served model's own config (the page scales them to OPT-13B)."""
    c, eng = client
    f = c.get("/playground/api/fast", params={"model": "tiny"}).json()
    cfg = eng.model_config
    assert (f["layers"], f["kv_heads"], f["head_dim"]) == (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
    assert f["kv_bytes_per_token"] % (2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim) == 0
    assert f["parameter_count"] > 0 and f["file_size"] > 0 and f["file"].endswith(".gguf")
    assert f["spec_stats"] is None and f["context_length"] >= f["max_model_len"] > 0


def test_measure_times_batch_one_and_batch_n(client) -> None:
    c, _ = client
    r = c.post("/playground/api/measure", json={"model": "tiny", "text": "the deploy failed", "chat": False, "n": 3, "tokens": 10})
    assert r.status_code == 200, r.text
    m = r.json()
    assert m["alone"]["n"] == 1 and m["batched"]["n"] == 3 and m["tokens"] == 10
    for side in (m["alone"], m["batched"]):           # steps that ran exactly those requests, decoding
        assert side["steps"] >= 1 and side["ms_per_step"] > 0
        assert side["tokens_per_s"] == pytest.approx(1000 * side["tokens_per_step"] / side["ms_per_step"])
    assert m["batched"]["tokens_per_step"] == pytest.approx(3)
    assert c.post("/playground/api/measure", json={"model": "tiny", "n": 99}).status_code == 400
    assert c.post("/playground/api/measure", json={"model": "tiny", "text": "x " * 200, "chat": False}).status_code == 400


def test_word_order_and_the_heads_grid(client) -> None:
    c, eng = client
    r = c.post("/playground/api/trace/order", json={"model": "tiny", "a": "the dog bites the man", "b": "the man bites the dog"})
    assert r.status_code == 200, r.text
    o = r.json()
    a, b = [p["id"] for p in o["a"]["pieces"]], [p["id"] for p in o["b"]["pieces"]]
    assert o["same_bag"] == (sorted(a) == sorted(b))
    ra, rb = trace_forward(eng.runner.model, a), trace_forward(eng.runner.model, b)
    for x in o["pairs"]:
        assert a[x["a"]] == b[x["b"]] and x["cos"][0] == pytest.approx(1.0, abs=1e-4)   # the same embedding row
        want = torch.cosine_similarity(ra.hidden[-1, x["a"]], rb.hidden[-1, x["b"]], dim=0)
        assert x["cos"][-1] == pytest.approx(float(want), abs=1e-3)
    s = c.post("/playground/api/trace", json={"model": "tiny", "text": "the bank by the river", "chat": False}).json()
    q = len(s["pieces"]) - 1
    h = c.post("/playground/api/trace/heads", json={"trace_id": s["trace_id"], "index": q}).json()
    ref = trace_forward(eng.runner.model, [p["id"] for p in s["pieces"]])
    torch.testing.assert_close(torch.tensor(h["probs"]), ref.attentions[:, :, q, : q + 1], atol=1e-3, rtol=0)
    # each head labelled by what it does over this trace's queries q >= 2: the token before, the first token,
    # itself, or earlier content (the largest mean share); the default view is the strongest content head
    a, qs = ref.attentions, torch.arange(2, len(s["pieces"]))
    prev, first, own = a[:, :, qs, qs - 1], a[:, :, qs, 0], a[:, :, qs, qs]
    shares = torch.stack([prev, first, own, 1 - prev - first - own], -1).mean(2)
    names = ["previous-token", "first-token sink", "self", "content"]
    assert h["kinds"] == [[names[int(k)] for k in row] for row in shares.argmax(-1)]
    best = h["strongest"]
    content = torch.tensor([[k == "content" for k in row] for row in h["kinds"]])
    inner = a[:, :, q, 1:q].clone()
    if content.any():
        inner[~content] = -1
        assert best["kind"] == "content"
    assert best["p"] == pytest.approx(float(inner.max()), abs=1e-5) and 0 < best["k"] < q
    assert c.post("/playground/api/trace/heads", json={"trace_id": s["trace_id"], "index": 999}).status_code == 400


def test_one_head_and_the_layer_parts(client) -> None:
    """q·k/√d per key against softmax (their softmax is the trace's row), and attention + MLP = the layer's step."""
    c, eng = client
    s = c.post("/playground/api/trace", json={"model": "tiny", "text": "the bank by the river", "chat": False}).json()
    q = len(s["pieces"]) - 1
    ref = trace_forward(eng.runner.model, [p["id"] for p in s["pieces"]])
    h = c.post("/playground/api/trace/head", json={"trace_id": s["trace_id"], "layer": 1, "head": 1, "index": q}).json()
    assert torch.softmax(torch.tensor(h["scores"]), -1).tolist() == pytest.approx(ref.attentions[1, 1, q, : q + 1].tolist(), abs=1e-5)
    assert sum(h["value_share"]) == pytest.approx(1) and len(h["value_norms"]) == q + 1
    parts = c.post("/playground/api/trace/parts", json={"trace_id": s["trace_id"], "index": q}).json()["layers"]
    assert len(parts) == eng.model_config.num_layers
    for p in parts:                                   # in + attention + mlp reproduces the traced layer output
        assert p["attention"] > 0 and p["mlp"] > 0 and p["error"] <= 1e-3 * max(1.0, p["scale"])
    bad = c.post("/playground/api/trace/head", json={"trace_id": s["trace_id"], "layer": 99, "head": 0, "index": q})
    assert bad.status_code == 400


def test_a_typed_word_probes_the_embedding_table(client) -> None:
    """/trace/probe: the word's first token (as it reads after a space), its row's nearest rows by cosine (itself
    first), computed here from the model's table; an empty word, a long one and the trigram toy are 400s."""
    c, eng = client
    r = c.post("/playground/api/trace/probe", json={"model": "tiny", "word": "hello"})
    assert r.status_code == 200, r.text
    j = r.json()
    ids = eng.tokenizer.encode(" hello", add_bos=False, parse_special=False)
    assert j["id"] == ids[0] and [p["id"] for p in j["pieces"]] == ids
    table = embedding_table(eng.runner.model).float()
    cos = torch.nn.functional.cosine_similarity(table, table[ids[0]][None], dim=-1)
    want = cos.topk(9).indices.tolist()
    assert [n["piece"]["id"] for n in j["nearest"]] == want and j["nearest"][0]["cos"] == pytest.approx(1, abs=1e-5)
    assert j["norm"] == pytest.approx(float(table[ids[0]].norm()), rel=1e-5)
    for body in ({"model": "tiny", "word": "   "}, {"model": "tiny", "word": "x" * 65}, {"model": "tiny"},
                 {"model": "trigram", "word": "hello"}):
        assert c.post("/playground/api/trace/probe", json=body).status_code == 400, body
