"""The serving engine on a tiny random model: batching, chunking, prefix hits and preemption must
not change a single token or logprob (bitwise), and nothing leaks."""

from __future__ import annotations

import random

import pytest

from hitenter import LLM, SamplingParams
from hitenter.errors import ContextOverflowError


def _prompts(n: int, seed: int = 0, lo: int = 3, hi: int = 90) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 250) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def _mixed_params(n: int) -> list[SamplingParams]:
    out = []
    for i in range(n):
        if i % 3 == 0:
            out.append(SamplingParams(temperature=0.0, max_tokens=8 + i % 5, ignore_eos=True, logprobs=2))
        elif i % 3 == 1:
            out.append(SamplingParams(temperature=0.9, top_p=0.9, seed=100 + i, max_tokens=7 + i % 4,
                                      ignore_eos=True, logprobs=1))
        else:
            out.append(SamplingParams(temperature=1.2, top_k=20, seed=7 * i, max_tokens=6, ignore_eos=True))
    return out


def _sig(out):  # tokens and logprobs, bitwise
    lps = None if out.logprobs is None else [(p.chosen.token_id, p.chosen.logprob) for p in out.logprobs]
    return (out.token_ids, lps)


@pytest.fixture(scope="module")
def llm(tiny_llama_path):
    return LLM(str(tiny_llama_path), max_num_seqs=64, max_num_batched_tokens=512)


def test_batch_invariance_32_mixed_requests(llm):
    prompts, params = _prompts(32), _mixed_params(32)
    together = llm.generate(prompts, params)
    alone = [llm.generate([p], [sp])[0] for p, sp in zip(prompts, params, strict=True)]
    for a, b in zip(together, alone, strict=True):
        assert _sig(a) == _sig(b)
    assert llm.engine.kv_manager.num_free_blocks == llm.engine.parts.num_blocks


@pytest.mark.slow
def test_generation_rows_use_the_fused_kernel(tiny_llama_path, monkeypatch):
    """Decode steps run the fused paged kernel (where it is built), and the torch-only path (kernel off)
    is batch invariant on its own too."""
    from hitenter.models import attention, decode_kernel

    prompts, params = _prompts(8, seed=5), _mixed_params(8)
    calls = []
    real = decode_kernel.decode_attention
    monkeypatch.setattr(attention.decode_kernel, "decode_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    with_kernel = LLM(str(tiny_llama_path)).generate(prompts, params)
    assert bool(calls) == (decode_kernel.load() is not None)
    monkeypatch.setattr(decode_kernel, "load", lambda: None)
    torch_only = LLM(str(tiny_llama_path))
    together = torch_only.generate(prompts, params)
    alone = [torch_only.generate([p], [sp])[0] for p, sp in zip(prompts, params, strict=True)]
    assert [_sig(o) for o in together] == [_sig(o) for o in alone]
    # the two paths differ by float rounding only: the same greedy tokens on this model
    assert [o.token_ids for o in together][::3] == [o.token_ids for o in with_kernel][::3]


def test_chunked_prefill_equals_unchunked(tiny_llama_path):
    prompts, params = _prompts(6, seed=3, lo=60, hi=120), _mixed_params(6)
    ref = LLM(str(tiny_llama_path), enable_prefix_caching=False).generate(prompts, params)
    small = LLM(str(tiny_llama_path), max_num_batched_tokens=24, enable_prefix_caching=False)
    seen_chunks = []
    small.engine.subscribe(lambda ev: seen_chunks.extend(w for w in ev.work if w.kind == "prefill"))
    got = small.generate(prompts, params)
    assert [_sig(o) for o in got] == [_sig(o) for o in ref]
    assert seen_chunks and max(w.num_tokens for w in seen_chunks) <= 24
    assert any(w.start > 0 for w in seen_chunks)  # a prompt really was split


def test_prefix_cache_hit_same_tokens_and_reports_cached(llm):
    prompt = _prompts(1, seed=11, lo=70, hi=70)[0]
    sp = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=3)
    cold = llm.generate([prompt], sp)[0]
    warm = llm.generate([prompt], sp)[0]
    assert _sig(warm) == _sig(cold)
    bs = llm.engine.parts.cache_config.block_size
    assert warm.num_cached_tokens == (len(prompt) - 1) // bs * bs > 0
    # a branch sharing the prefix reuses its blocks too
    branch = llm.generate([prompt[:50] + [5, 6, 7]], sp)[0]
    assert branch.num_cached_tokens == 48


@pytest.mark.slow
def test_preemption_small_kv_budget_same_outputs(tiny_llama_path, llm):
    prompts, params = _prompts(12, seed=5, lo=20, hi=60), _mixed_params(12)
    ref = llm.generate(prompts, params)
    per_block = llm.engine.plan.kv_bytes_per_token * 16   # the cache's own elements (f16 by default)
    tight = LLM(str(tiny_llama_path), kv_cache_memory=per_block * 18, max_model_len=256)
    preempted = []
    tight.engine.subscribe(lambda ev: preempted.extend(ev.preempted))
    got = tight.generate(prompts, params)
    assert [_sig(o) for o in got] == [_sig(o) for o in ref]
    assert preempted, "the budget was meant to force preemption"
    assert tight.engine.kv_manager.num_free_blocks == tight.engine.parts.num_blocks


def test_context_overflow_rejected_before_any_work(llm):
    before = llm.engine.step_counter
    n_ctx = llm.engine.max_model_len
    with pytest.raises(ContextOverflowError) as ei:
        llm.generate([[5] * (n_ctx - 4)], SamplingParams(max_tokens=10))
    assert ei.value.n_prompt_tokens == n_ctx - 4 and ei.value.n_ctx == n_ctx
    assert "max_tokens" in str(ei.value)
    assert llm.engine.step_counter == before
    assert not llm.engine.has_unfinished_requests()


def test_without_max_tokens_runs_to_the_window(tiny_llama_path):
    small = LLM(str(tiny_llama_path), max_model_len=40)
    out = small.generate([[5] * 30], SamplingParams(temperature=0, ignore_eos=True, max_tokens=None))[0]
    assert len(out.token_ids) == 10 and out.finish_reason == "length"


def test_kv_budget_too_small_refused_at_start(tiny_llama_path):
    with pytest.raises(ValueError, match="kv_cache_memory") as ei:
        LLM(str(tiny_llama_path), kv_cache_memory=10_000, max_model_len=256)
    assert "10000" in str(ei.value) and "256" in str(ei.value)


def test_abort_frees_blocks(llm):
    eng = llm.engine
    rid = eng.add_request(None, _prompts(1, seed=9, lo=80, hi=80)[0], SamplingParams(max_tokens=50, ignore_eos=True))
    eng.step()
    assert eng.kv_manager.num_free_blocks < eng.parts.num_blocks
    eng.abort(rid)
    assert eng.kv_manager.num_free_blocks == eng.parts.num_blocks
    assert not eng.has_unfinished_requests()


def test_n_samples_seeded(llm):
    sp = SamplingParams(n=3, temperature=1.0, seed=42, max_tokens=8, ignore_eos=True)
    a = llm.generate([[10, 20, 30]], sp)[0]
    b = llm.generate([[10, 20, 30]], sp)[0]
    assert len(a.outputs) == 3 and [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    assert len({tuple(o.token_ids) for o in a.outputs}) > 1


def test_seed_reproducibility_among_unseeded(llm):
    sp = SamplingParams(temperature=1.0, seed=1234, max_tokens=10, ignore_eos=True)
    alone = llm.generate([[7, 8, 9]], sp)[0].token_ids
    noisy = [SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True) for _ in range(5)]
    mixed = llm.generate([[1, 2, 3]] * 2 + [[7, 8, 9]] + [[4, 5]] * 3, noisy[:2] + [sp] + noisy[2:5])
    assert mixed[2].token_ids == alone


def test_event_stream_matches_engine(llm):
    events = []
    unsub = llm.engine.subscribe(events.append)
    prompts = _prompts(4, seed=21)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    unsub()
    sampled: dict[str, list[int]] = {}
    computed: dict[str, int] = {}
    for ev in events:
        for w in ev.work:
            assert computed.get(w.request_id, w.start) <= w.start  # positions only move forward
            computed[w.request_id] = w.start + w.num_tokens
            if w.sampled is not None:
                sampled.setdefault(w.request_id, []).append(w.sampled)
    assert sorted(sampled.values()) == sorted(o.token_ids for o in outs)
    assert {rid for ev in events for rid, _ in ev.finished} == {o.request_id for o in outs}
    assert events[-1].num_free_blocks == llm.engine.parts.num_blocks


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["int4", "int8", "bfloat16"])
def test_batch_invariance_other_weight_formats(tmp_path, kind):
    """Quantized models run unpadded (their kernels give a row the same bits for any row count) and bf16
    models padded: either way 16 mixed requests together, chunked, equal each one alone, bitwise."""
    from hitenter.testing.tiny_model import write_tiny_gguf

    path = str(write_tiny_gguf(tmp_path / "q41.gguf", arch="llama", quant="Q4_1"))
    kw = {"dtype": "bfloat16"} if kind == "bfloat16" else {"quantization": kind}
    one = LLM(path, max_num_batched_tokens=40, enable_prefix_caching=False, **kw)
    assert one.engine.parts.model.dense_gemms == (kind == "bfloat16")
    prompts, params = _prompts(16, seed=2, lo=3, hi=70), _mixed_params(16)
    together = one.generate(prompts, params)
    alone = [one.generate([p], [sp])[0] for p, sp in zip(prompts, params, strict=True)]
    assert [_sig(o) for o in together] == [_sig(o) for o in alone]
