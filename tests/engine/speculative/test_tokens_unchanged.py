"""Speculative decoding must not change a single greedy or seeded token or logprob (bitwise), whatever the
proposer, how many drafts are rejected, chunking, preemption, stops or max_tokens; nothing leaks."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hitenter import LLM, SamplingParams
from hitenter.engine.speculative import check_vocab_compatible
from hitenter.testing.tiny_model import write_tiny_gguf


def _prompts(n: int, seed: int = 0, lo: int = 3, hi: int = 60) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = [rng.randrange(3, 250) for _ in range(rng.randint(lo, hi))]
        out.append(p + p[: len(p) // 2])          # some repetition, so prompt lookup finds matches
    return out


def _sig(o):
    c = o.outputs[0]
    lps = None if c.logprobs is None else [(p.chosen.token_id, p.chosen.logprob, p.chosen.rank) for p in c.logprobs]
    return c.token_ids, lps, c.text, c.finish_reason, c.stop_reason


@pytest.fixture(autouse=True)
def fixed_draft_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check verification at a fixed draft length, drafted by the model alone; the adaptive
    length and prompt lookup before the draft model have their own tests (tests/engine/speculative/test_adaptive.py)."""
    monkeypatch.setenv("HITENTER_SPEC_ADAPTIVE", "0")
    monkeypatch.setenv("HITENTER_DRAFT_LOOKUP", "0")


@pytest.fixture(scope="module")
def drafts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("drafts")
    return {"other": write_tiny_gguf(d / "other.gguf", arch="qwen2", seed=3),           # almost never agrees
            "one_layer": write_tiny_gguf(d / "one.gguf", arch="qwen2", seed=1, layers=1)}  # agrees sometimes


@pytest.fixture(scope="module")
def plain(tiny_qwen2_path):
    return LLM(str(tiny_qwen2_path))


GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=2)


def _all_free(llm: LLM) -> bool:
    eng = llm.engine
    ok = eng.kv_manager.num_free_blocks == eng.parts.num_blocks
    kv = getattr(eng.spec.proposer, "kv", None) if eng.spec is not None else None
    if kv is not None:
        kv.check_invariants()
        ok = ok and kv.num_free_blocks == kv.num_blocks
    eng.kv_manager.check_invariants()
    return ok


@pytest.mark.parametrize("which,k", [("other", 3), ("one_layer", 4), ("same", 3), ("ngram", 3), ("ngram", 1)])
def test_greedy_identical(tiny_qwen2_path, drafts, plain, which, k):
    prompts = _prompts(8)
    ref = plain.generate(prompts, GREEDY)
    opts = {"speculative_method": "ngram"} if which == "ngram" else {
        "speculative_model": str(tiny_qwen2_path if which == "same" else drafts[which])}
    llm = LLM(str(tiny_qwen2_path), num_speculative_tokens=k, **opts)
    got = llm.generate(prompts, GREEDY)
    assert [_sig(o) for o in got] == [_sig(o) for o in ref]
    st = llm.engine.spec_decode
    assert st is not None and st.num_draft_tokens > 0
    if which == "same":
        assert st.acceptance_rate == 1.0 and st.mean_accepted_length > k - 1
    elif which == "other":
        assert st.acceptance_rate < 0.2
    elif which == "one_layer":
        assert 0.05 < st.acceptance_rate < 0.95
    else:
        assert st.num_accepted_tokens > 0
    per_req = [o.extra["spec_decode"] for o in got]
    assert sum(r["num_draft_tokens"] for r in per_req) == st.num_draft_tokens
    assert sum(r["num_accepted_tokens"] for r in per_req) == st.num_accepted_tokens
    assert all(0.0 <= r["acceptance_rate"] <= 1.0 for r in per_req)
    assert _all_free(llm)


@pytest.mark.slow
def test_mixed_batch_spec_and_plain_rows(tiny_qwen2_path, drafts, plain):
    """Greedy, seeded sampling and no-draft rows (max_tokens <= 2) share batches with speculating rows; all
    of them emit the tokens they emit without speculation."""
    prompts = _prompts(12, seed=4)
    params = []
    for i in range(12):
        if i % 3 == 0:      # greedy, half of them with penalties (which read the drafted history)
            pen = dict(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2) if i % 2 else {}
            params.append(SamplingParams(temperature=0.0, max_tokens=6 + i, ignore_eos=True, logprobs=1, **pen))
        elif i % 3 == 1:
            params.append(SamplingParams(temperature=0.8, seed=i, max_tokens=2, ignore_eos=True, logprobs=1))
        else:
            params.append(SamplingParams(temperature=0.9, top_p=0.9, seed=i, max_tokens=12, ignore_eos=True))
    ref = plain.generate(prompts, params)
    llm = LLM(str(tiny_qwen2_path), speculative_model=str(drafts["one_layer"]), num_speculative_tokens=3)
    got = llm.generate(prompts, params)
    again = llm.generate(prompts, params)
    for i, (a, b, c) in enumerate(zip(ref, got, again, strict=True)):
        # every row bitwise the same tokens: greedy, never-speculating and seeded sampling rows (verified
        # by drawing each row with the request's own next seed, as plain decoding does)
        assert _sig(b) == _sig(a), i
        assert _sig(c) == _sig(b)    # seeded sampling with speculation is reproducible
        assert len(b.outputs[0].token_ids) == params[i].max_tokens
    assert _all_free(llm)


@pytest.mark.slow
def test_chunking_and_preemption_with_drafts(tiny_qwen2_path, drafts, plain):
    prompts = _prompts(10, seed=7, lo=20, hi=50)
    sp = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=1)
    ref = plain.generate(prompts, sp)
    per_block = plain.engine.plan.kv_bytes_per_token * 16   # the cache's own elements (f16 by default)
    for opts in (dict(max_num_batched_tokens=10),                              # drafts cut by the budget
                 dict(kv_cache_memory=per_block * 20, max_model_len=256)):     # preemption
        llm = LLM(str(tiny_qwen2_path), speculative_model=str(tiny_qwen2_path), num_speculative_tokens=4,
                  enable_prefix_caching=True, **opts)
        preempted: list[str] = []
        llm.engine.subscribe(lambda ev, acc=preempted: acc.extend(ev.preempted))
        got = llm.generate(prompts, sp)
        assert [_sig(o) for o in got] == [_sig(o) for o in ref], opts
        assert _all_free(llm)
        if "kv_cache_memory" in opts:
            assert preempted


def test_stops_and_max_tokens_identical(tiny_qwen2_path, plain):
    """Stop strings, stop tokens, min_tokens and max_tokens inside an accepted run (a draft that is always
    right accepts K tokens per step), with streaming deltas that add up to the final text."""
    prompts = _prompts(6, seed=9)
    base = plain.generate(prompts, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    cases = []
    for o in base:
        toks, text = o.outputs[0].token_ids, o.outputs[0].text
        stop_str = next((text[i:i + 2] for i in range(len(text) // 3, len(text) - 2)
                         if text[i:i + 2].isascii() and text[i:i + 2].strip()), None)
        cases.append([
            SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[toks[7]], logprobs=1),
            SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[toks[1]], min_tokens=5),
            SamplingParams(temperature=0.0, max_tokens=30, stop=[stop_str] if stop_str else None, ignore_eos=True),
            SamplingParams(temperature=0.0, max_tokens=30, stop=[stop_str] if stop_str else None, ignore_eos=True,
                           include_stop_str_in_output=True),
            SamplingParams(temperature=0.0, max_tokens=1 + len(toks) % 7, ignore_eos=True),
        ])
    flat_prompts = [p for p, c in zip(prompts, cases, strict=True) for _ in c]
    flat_params = [sp for c in cases for sp in c]
    ref = plain.generate(flat_prompts, flat_params)
    llm = LLM(str(tiny_qwen2_path), speculative_model=str(tiny_qwen2_path), num_speculative_tokens=4)
    deltas: dict[str, list[str]] = {}
    multi = []

    def on_output(out):
        c = out.outputs[0]
        deltas.setdefault(out.request_id, []).append(c.delta_text)
        multi.append(len(c.delta_token_ids))

    got = llm.generate(flat_prompts, flat_params, on_output=on_output)
    assert [_sig(o) for o in got] == [_sig(o) for o in ref]
    assert any(o.outputs[0].stop_reason is not None for o in got)
    for o in got:
        assert "".join(deltas[o.request_id]) == o.outputs[0].text
    assert max(multi) > 1, "several tokens arrive in one step"
    assert _all_free(llm)


def test_options_validated(tiny_qwen2_path):
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM(str(tiny_qwen2_path), num_speculative_tokens=3)
    with pytest.raises(ValueError, match="speculative_method"):
        LLM(str(tiny_qwen2_path), speculative_method="medusa")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM(str(tiny_qwen2_path), speculative_method="ngram", num_speculative_tokens=0)
    assert LLM(str(tiny_qwen2_path), speculative_model="[ngram]").engine.spec.method == "ngram"


def test_vocab_mismatch_is_a_clear_error():
    class Tok:
        def __init__(self, pieces: list[bytes]) -> None:
            self.pieces = pieces
            self.vocab_size = len(pieces)

        def token_bytes(self, t: int) -> bytes:
            return self.pieces[t]

    a, b = Tok([b"a", b"b", b"c"]), Tok([b"a", b"x", b"c"])
    check_vocab_compatible(a, Tok(list(a.pieces)), 3, 3, "d")
    with pytest.raises(ValueError, match=r"token 1: b'x' vs b'b'"):
        check_vocab_compatible(a, b, 3, 3, "d")
    with pytest.raises(ValueError, match="logits"):
        check_vocab_compatible(a, a, 3, 4, "d")


@pytest.mark.slow
def test_draft_with_another_tokenizer_refused(tiny_qwen2_path, smollm2_path):
    with pytest.raises(ValueError, match="share the target's tokenizer"):
        LLM(str(tiny_qwen2_path), speculative_model=str(smollm2_path))


CODE = """def checksum(data):
    total = 0
    for i, byte in enumerate(data):
        total = (total * 31 + byte + i) % 65521
    return total
"""
CODE_PROMPT = f"Copy this Python code:\n\n```python\n{CODE}```"


@pytest.mark.slow
def test_smollm2_prompt_lookup_on_code_identical(smollm2_path, smollm2_llm):
    sp = SamplingParams(temperature=0.0, max_tokens=48, logprobs=1)
    msgs = [{"role": "user", "content": CODE_PROMPT}]
    ref = smollm2_llm.chat(msgs, sp)[0]
    llm = LLM(str(smollm2_path), max_model_len=1024, speculative_method="ngram", num_speculative_tokens=4)
    got = llm.chat(msgs, sp)[0]
    assert _sig(got) == _sig(ref)
    assert llm.engine.spec_decode is not None and llm.engine.spec_decode.num_accepted_tokens > 0


def _cached(name: str) -> Path | None:
    from hitenter.models.registry import model_path

    p = model_path(name)
    return p if p.exists() else None


@pytest.mark.slow
@pytest.mark.skipif(not (_cached("qwen2.5-coder-0.5b-instruct") and _cached("qwen2.5-coder-1.5b-instruct")),
                    reason="needs both Qwen2.5-Coder GGUFs cached (hitenter pull qwen2.5-coder-1.5b-instruct)")
def test_qwen_coder_draft_pair_identical():
    target, draft = _cached("qwen2.5-coder-1.5b-instruct"), _cached("qwen2.5-coder-0.5b-instruct")
    sp = SamplingParams(temperature=0.0, max_tokens=24)
    msgs = [{"role": "user", "content": CODE_PROMPT}]
    ref = LLM(str(target), max_model_len=512).chat(msgs, sp)[0]
    llm = LLM(str(target), max_model_len=512, speculative_model=str(draft), num_speculative_tokens=4)
    assert _sig(llm.chat(msgs, sp)[0]) == _sig(ref)
    assert llm.engine.spec_decode is not None and llm.engine.spec_decode.acceptance_rate > 0.3


def test_event_stream_reports_every_accepted_token(tiny_qwen2_path):
    llm = LLM(str(tiny_qwen2_path), speculative_method="ngram", num_speculative_tokens=3)
    events = []
    llm.engine.subscribe(events.append)
    out = llm.generate([[5, 6, 7, 8] * 6], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    per_step = [w.tokens for ev in events for w in ev.work if w.tokens]
    assert [t for toks in per_step for t in toks] == out.token_ids
    assert all(toks[0] == w.sampled for ev in events for w in ev.work if (toks := w.tokens))
