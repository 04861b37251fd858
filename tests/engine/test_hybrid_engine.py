"""The serving engine on hybrid (recurrent-state) models, tiny random files of each hybrid family: batching,
chunked prefill and a prefix-cache hit give the lone run's bits; a chat's next turn resumes from a state
snapshot and re-reads at most the new turn plus one block (the engine's own counters); preemption,
aborts and n-gram speculation keep tokens and slots right."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hitenter import LLM, SamplingParams
from hitenter.models.families import FAMILIES
from hitenter.testing.tiny_hybrids import HYBRIDS, write_tiny_hybrid

pytestmark = pytest.mark.slow   # one engine build per family and test: ~1 s each on 2 cores
BS = 16
FAMS = [f for f, (arch, _) in HYBRIDS.items() if arch in FAMILIES]


@pytest.fixture(scope="module", params=FAMS)
def hybrid_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the layers' projections in Q8_0, as real files hold blocks: the native kernels give every row the same
    # bits whatever the batch (dense fp32 experts of a large batch are not yet row invariant: models/moe.py)
    return write_tiny_hybrid(tmp_path_factory.mktemp("hybrid") / f"{request.param}.gguf", request.param, seed=3,
                             quant="Q8_0")


def _prompts(n: int, seed: int = 0, lo: int = 3, hi: int = 70) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 250) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def _params(n: int) -> list[SamplingParams]:
    out = []
    for i in range(n):
        if i % 2:
            out.append(SamplingParams(temperature=0.9, top_p=0.9, seed=10 + i, max_tokens=6 + i % 4, ignore_eos=True,
                                      logprobs=1))
        else:
            out.append(SamplingParams(temperature=0.0, max_tokens=5 + i % 3, ignore_eos=True, logprobs=2))
    return out


def _sig(out):  # noqa: ANN001, ANN202 -- tokens and logprobs, bitwise
    lps = None if out.logprobs is None else [(p.chosen.token_id, p.chosen.logprob) for p in out.logprobs]
    return (out.token_ids, lps)


def _free(llm: LLM) -> None:
    kv = llm.engine.kv_manager
    kv.check_invariants()
    assert kv.num_free_blocks == llm.engine.parts.num_blocks
    assert not kv.state.live and kv.state.num_free_slots == kv.state.num_slots


def test_batched_and_chunked_runs_give_the_lone_runs_bits(hybrid_path: Path) -> None:
    prompts, params = _prompts(12), _params(12)
    alone_llm = LLM(str(hybrid_path), enable_prefix_caching=False, max_num_batched_tokens=256)
    alone = [alone_llm.generate([p], [sp])[0].outputs[0] for p, sp in zip(prompts, params, strict=True)]
    together = LLM(str(hybrid_path), enable_prefix_caching=False, max_num_batched_tokens=256)
    for a, b in zip(alone, (o.outputs[0] for o in together.generate(prompts, params)), strict=True):
        assert _sig(a) == _sig(b)
    chunked = LLM(str(hybrid_path), enable_prefix_caching=False, max_num_batched_tokens=24)
    for a, b in zip(alone, (o.outputs[0] for o in chunked.generate(prompts, params)), strict=True):
        assert _sig(a) == _sig(b)
    _free(together)
    _free(chunked)


def test_a_prefix_hit_resumes_from_a_snapshot_with_the_lone_runs_bits(hybrid_path: Path) -> None:
    rng = random.Random(1)
    base = [rng.randrange(3, 250) for _ in range(50)]
    longer = base + [rng.randrange(3, 250) for _ in range(9)]
    sp = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3)
    ref = LLM(str(hybrid_path), enable_prefix_caching=False).generate([longer], [sp])[0]
    llm = LLM(str(hybrid_path))
    llm.generate([base], [SamplingParams(max_tokens=1)])
    out = llm.generate([longer], [sp])[0]
    assert out.num_cached_tokens == (len(base) - 1) // BS * BS   # the snapshot before the prompt's last row
    assert _sig(out.outputs[0]) == _sig(ref.outputs[0])
    _free(llm)


def test_each_chat_turn_rereads_at_most_the_new_turn_plus_one_block(hybrid_path: Path) -> None:
    """Eight turns of one conversation, two conversations interleaved: each turn's prompt is the previous
    prompt + reply + a new user turn, and the engine reads again only what follows its last snapshot."""
    llm = LLM(str(hybrid_path), max_model_len=2048)
    rng = random.Random(2)
    convs: list[list[int]] = [[], []]
    for _turn in range(8):
        for c in range(2):
            new = [rng.randrange(3, 250) for _ in range(rng.randint(5, 30))]
            prompt = convs[c] + new
            out = llm.generate([prompt], [SamplingParams(temperature=0.0, max_tokens=rng.randint(3, 20),
                                                          ignore_eos=True)])[0]
            reread = len(prompt) - out.num_cached_tokens
            assert reread <= len(new) + BS, (len(convs[c]), len(new), out.num_cached_tokens)
            convs[c] = prompt + list(out.outputs[0].token_ids)
    _free(llm)


def test_an_edited_earlier_message_resumes_from_the_snapshot_before_the_edit(hybrid_path: Path) -> None:
    llm = LLM(str(hybrid_path), max_model_len=2048)
    llm.engine.kv_manager.state.interval = 2   # a periodic snapshot every 2 blocks
    rng = random.Random(3)
    first = [rng.randrange(3, 250) for _ in range(100)]
    llm.generate([first], [SamplingParams(max_tokens=2, ignore_eos=True)])
    edited = list(first)
    edited[70] = 3 if edited[70] != 3 else 4
    out = llm.generate([edited + [5, 6, 7]], [SamplingParams(max_tokens=2, ignore_eos=True)])[0]
    assert out.num_cached_tokens == 64        # the last periodic snapshot before position 70
    _free(llm)


def test_preemption_recomputes_the_same_tokens(hybrid_path: Path) -> None:
    import torch

    prompts, params = _prompts(8, seed=4, lo=20, hi=60), _params(8)
    big = LLM(str(hybrid_path), enable_prefix_caching=False)
    ref = [o.outputs[0] for o in big.generate(prompts, params)]
    per_block = sum(c[:, :, 0].nbytes for c in big.engine.runner.kv_caches if isinstance(c, torch.Tensor) and c.dim() == 5)
    states = 8 * big.engine.parts.model.state_bytes_per_slot()   # 8 running sequences' slots, in the budget
    small = LLM(str(hybrid_path), enable_prefix_caching=False, max_model_len=128, max_num_seqs=8,
                kv_cache_memory=10 * per_block + states)
    outs = [o.outputs[0] for o in small.generate(prompts, params)]
    assert small.engine.scheduler.stats.num_preemptions > 0
    for a, b in zip(ref, outs, strict=True):
        assert _sig(a) == _sig(b)
    _free(small)


def test_ngram_speculation_gives_the_same_greedy_tokens(hybrid_path: Path) -> None:
    rng = random.Random(5)
    text = [rng.randrange(3, 250) for _ in range(24)]
    prompt = text + text + text[:10]             # a repeat-the-text prompt: the n-gram proposer drafts well
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    ref = LLM(str(hybrid_path)).generate([prompt], [sp])[0].outputs[0].token_ids
    spec = LLM(str(hybrid_path), speculative_method="ngram", num_speculative_tokens=3)
    got = spec.generate([prompt, prompt[:40]], [sp, sp])
    assert got[0].outputs[0].token_ids == ref
    _free(spec)


def test_state_slots_are_counted_in_the_kv_budget(hybrid_path: Path) -> None:
    import torch

    probe = LLM(str(hybrid_path), max_model_len=128, max_num_seqs=4)
    per_block = sum(c[:, :, 0].nbytes for c in probe.engine.runner.kv_caches if isinstance(c, torch.Tensor) and c.dim() == 5)
    per_slot = probe.engine.parts.model.state_bytes_per_slot()
    budget = 40 * per_block + 16 * per_slot
    llm = LLM(str(hybrid_path), max_model_len=128, max_num_seqs=4, kv_cache_memory=budget)
    slots = llm.engine.kv_manager.state.num_slots
    assert slots >= 4 + 4
    assert llm.engine.parts.num_blocks * per_block + slots * per_slot <= budget
    with pytest.raises(ValueError, match="recurrent state"):
        LLM(str(hybrid_path), max_model_len=128, max_num_seqs=64, kv_cache_memory=8 * per_block + 8 * per_slot)
