"""The toy trigram model: counts, the engine interface over the paged cache, last-two-tokens only."""

from __future__ import annotations

import math

import pytest
import torch

from hitenter.models.attention import AttentionMetadata, allocate_kv_caches
from hitenter.models.trigram import ADD_K, NEVER, TrigramLM, load_trigram


@pytest.fixture(scope="module")
def trigram():
    return load_trigram("trigram")


@pytest.fixture(scope="module")
def llm():
    from hitenter import LLM

    return LLM("trigram", kv_cache_memory=1 << 20, block_size=4)


def test_counts_on_a_hand_checked_sentence() -> None:
    # END=0; "5 6 7 5 6 8" -> padded [0, 5, 6, 7, 5, 6, 8, 0]
    m = TrigramLM([[5, 6, 7, 5, 6, 8]], vocab_size=10, end_id=0)
    assert m.lookup(5, 6)["counts"] == [(7, 1), (8, 1)]
    assert m.lookup(5, 6)["total"] == 2 and m.lookup(5, 6)["seen"]
    assert m.lookup(0, 5)["counts"] == [(6, 1)]            # the first token is looked up after END
    assert m.lookup(6, 8)["counts"] == [(0, 1)]            # ... and the sentence ends with END
    assert m.bigrams[6] == {7: 1, 8: 1} and m.unigrams[5] == 2
    # logits: add-k smoothed counts over the corpus vocabulary {0, 5, 6, 7, 8}; others impossible
    logits = m.compute_logits(torch.tensor([[5.0, 6.0]]))[0]
    denom = 2 + ADD_K * 5
    assert logits[7].item() == pytest.approx(math.log((1 + ADD_K) / denom))
    assert logits[5].item() == pytest.approx(math.log(ADD_K / denom))
    assert logits[3].item() == NEVER
    assert torch.softmax(logits, -1).sum().item() == pytest.approx(1.0)


def test_counts_on_the_real_corpus(trigram) -> None:
    model, cfg, tok = trigram
    assert cfg.num_layers == 1 and cfg.num_kv_heads == 1 and cfg.vocab_size == tok.vocab_size
    t2, t1 = tok.encode(" is full")
    row = model.lookup(t2, t1)
    # corpus lines 6, 7, 41: "... is full again." / "... is full because ..." / "... is full."
    assert {tok.decode([t]): c for t, c in row["counts"]} == {" again": 1, " because": 1, ".": 1}
    assert row["total"] == 3 and row["seen"] and row["backoff"] == "trigram"


def test_unseen_pair_is_an_empty_row_and_backs_off(trigram) -> None:
    model, _, tok = trigram
    (zebra,) = tok.encode(" zebra")
    (full,) = tok.encode(" full")
    row = model.lookup(zebra, full)
    assert row == {**row, "pair": [zebra, full], "counts": [], "total": 0, "seen": False, "backoff": "bigram"}
    assert dict(row["backoff_counts"]) == dict(model.bigrams[full])
    never = model.lookup(zebra, zebra)
    assert never["counts"] == [] and never["backoff"] == "unigram"


def test_forward_reads_the_previous_token_through_the_block_table(trigram) -> None:
    model, cfg, _ = trigram
    caches = allocate_kv_caches(cfg, num_blocks=6, block_size=4)
    ids = [1195, 10599, 314, 2586, 30, 40000]           # 6 tokens in blocks 5 then 2 (out of order)
    table = [5, 2]
    meta = AttentionMetadata([0, 6], [6], [table], torch.tensor([5 * 4 + p if p < 4 else 2 * 4 + p - 4
                                                                 for p in range(6)]), 4)
    hidden = model(torch.tensor(ids), torch.arange(6), meta, caches)
    assert hidden.tolist() == [[model.end_id, ids[0]]] + [[ids[i - 1], ids[i]] for i in range(1, 6)]
    k = caches[0][0]
    assert int(k[0, 2, 1, 0]) * 256 + int(k[0, 2, 1, 1]) == 40000   # position 5 -> block 2, offset 1
    # a decode step: only the new token is passed; the one before comes from the cache
    meta2 = AttentionMetadata([0, 1], [7], [table], torch.tensor([2 * 4 + 2]), 4)
    h2 = model(torch.tensor([7]), torch.tensor([6]), meta2, caches)
    assert h2.tolist() == [[40000, 7]]


def _next_logprobs(llm, prompt_ids):
    from hitenter import SamplingParams

    out = llm.generate(prompt_ids, SamplingParams(temperature=0, max_tokens=1, logprobs=20))[0]
    return [(t.token_id, round(t.logprob, 6)) for t in out.logprobs[0].top]


def test_engine_generation_uses_only_the_last_two_tokens(llm) -> None:
    from hitenter import SamplingParams

    tok = llm.tokenizer
    a = tok.encode("the disk is full")
    b = tok.encode("who approved a deploy on friday because it is full")
    assert a[-2:] == b[-2:] and a[:-2] != b[:-2]
    assert _next_logprobs(llm, a) == _next_logprobs(llm, b)
    c = tok.encode("the disk was full")                     # change the second-to-last: it changes
    assert _next_logprobs(llm, a) != _next_logprobs(llm, c)
    # and the whole greedy continuation agrees, step after step
    p = SamplingParams(temperature=0, max_tokens=12)
    ra, rb = llm.generate([a, b], p)
    assert ra.token_ids == rb.token_ids and ra.finish_reason == "stop"
    model = llm.engine.parts.model
    lp = _next_logprobs(llm, a)
    counts = dict(model.lookup(a[-2], a[-1])["counts"])
    best = max(counts, key=counts.get)
    assert lp[0][0] in [t for t, c in counts.items() if c == counts[best]]
    assert lp[0][1] == pytest.approx(math.log((counts[lp[0][0]] + ADD_K) / (3 + ADD_K * len(model.corpus_vocab))),
                                     abs=1e-5)


def test_engine_handles_an_unseen_pair(llm) -> None:
    from hitenter import SamplingParams

    tok = llm.tokenizer
    ids = tok.encode("zebra quantum")
    model = llm.engine.parts.model
    assert not model.lookup(ids[-2], ids[-1])["seen"]
    out = llm.generate(ids, SamplingParams(temperature=0.8, seed=3, max_tokens=8))[0]
    assert out.finish_reason in ("stop", "length") and len(out.token_ids) >= 1
    assert all(t in set(model.corpus_vocab.tolist()) for t in out.token_ids)   # only words it has read
