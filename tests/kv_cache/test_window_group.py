"""Sliding-window layers release the blocks their window left (hitenter/kv_cache/window_group.py): the
manager's two groups under prefill, decode, prefix hits, trims and preemption; the blocks one Gemma 3 request
holds at 8k context against one table for all layers; an engine's outputs identical with and without release."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from hitenter.kv_cache.manager import KVCacheManager
from hitenter.kv_cache.window_group import PLACEHOLDER, split_blocks
from hitenter.models import fused_decode
from hitenter.models.attention import AttentionMetadata, allocate_kv_caches
from hitenter.models.loader import load_model
from hitenter.request import Request, RequestStatus


def req(rid: str, prompt: list[int]) -> Request:
    return Request(rid, list(prompt), None, 100)  # type: ignore[arg-type]


def step(m: KVCacheManager, r: Request, n: int) -> None:
    """One scheduled step of n tokens, as the scheduler and update() run it."""
    if r.num_computed_tokens == 0 and not m.block_table(r.request_id):
        hits, nh = m.get_computed_blocks(r)
        assert m.allocate_slots(r, n, hits) is not None
        r.num_computed_tokens = nh
        r.status = RequestStatus.RUNNING
    else:
        assert m.allocate_slots(r, n) is not None
    r.num_computed_tokens += n
    m.cache_blocks(r, r.num_computed_tokens)
    m.check_invariants()


def test_local_table_releases_outside_the_window() -> None:
    m = KVCacheManager(32, 4, local_window=8)
    r = req("a", list(range(40)))
    assert m.allocate_slots(r, 40) is not None       # the prompt's rows read from key 0: nothing released yet
    assert m.held_blocks("a") == (10, 10)
    r.num_computed_tokens = 40
    m.cache_blocks(r, 40)                            # the step ran: the next row (40) reads keys 33.. only
    assert m.held_blocks("a") == (10, 2)
    r.output_token_ids.append(7)
    step(m, r, 1)                                    # position 40 reads keys 33..40: blocks 8..10
    table = m.local_block_table("a")
    assert len(table) == len(m.block_table("a")) == 11 and table[:8] == [PLACEHOLDER] * 8
    assert m.held_blocks("a") == (11, 3)
    assert m.local.pool.num_free_blocks == 32 - 3
    m.free(r)
    assert m.local.pool.num_free_blocks == 32 and m.num_free_blocks == 32
    m.check_invariants()


def test_prefix_hit_needs_the_window_cached() -> None:
    m = KVCacheManager(64, 4, local_window=8)
    a = req("a", list(range(40)))
    step(m, a, 40)
    a.output_token_ids.append(7)
    step(m, a, 1)                                    # a's local blocks 0..7 released, still hashed in the pool
    b = req("b", list(range(40)) + [99])
    hits, n = m.get_computed_blocks(b)
    assert n == 40                                   # the row at 40 reads blocks 8, 9: both cached
    step(m, b, b.num_tokens - n)
    assert m.local_block_table("b")[:8] == [PLACEHOLDER] * 8
    m.free(a)
    m.free(b)
    m.check_invariants()
    lp = m.local.pool                                # evict every local block: a global hit finds no window
    lp.get_new_blocks(lp.num_blocks)
    lp.free_blocks(range(lp.num_blocks))
    c = req("c", list(range(40)) + [5])
    assert m.get_computed_blocks(c) == ([], 0)
    m.check_invariants()


def test_random_ops_keep_invariants() -> None:
    rng = random.Random(0)
    m = KVCacheManager(48, 4, local_window=6, num_local_blocks=24)
    live: list[Request] = []
    for i in range(300):
        if len(live) < 3 and rng.random() < 0.3:
            live.append(req(f"r{i}", [rng.randrange(3) for _ in range(rng.randrange(2, 30))]))
        if not live:
            continue
        r = rng.choice(live)
        op = rng.random()
        if op < 0.15 or r.num_tokens > 120:
            m.free(r)
            live.remove(r)
        elif op < 0.25 and r.num_computed_tokens:     # preemption: recompute from scratch
            m.free(r)
            r.num_computed_tokens = 0
        else:
            if r.num_computed_tokens == r.num_tokens:
                r.output_token_ids.append(rng.randrange(3))
            left = r.num_tokens - r.num_computed_tokens
            n = min(left, rng.randrange(1, 12))
            hits, nh = ([], 0) if m.block_table(r.request_id) else m.get_computed_blocks(r)
            n = min(n, r.num_tokens - nh)
            if m.allocate_slots(r, n, hits) is None:
                continue
            r.num_computed_tokens = nh + n if hits or not r.num_computed_tokens else r.num_computed_tokens + n
            if rng.random() < 0.2 and n > 1:          # rejected drafts: roll back and trim
                r.num_computed_tokens -= 1
                m.trim(r, r.num_computed_tokens)
            m.cache_blocks(r, r.num_computed_tokens)
        m.check_invariants()
    for r in live:
        m.free(r)
    assert m.num_free_blocks == 48 and m.local.pool.num_free_blocks == 24


def held_fraction(num_layers: int, window_of: list[int | None], window: int, block_size: int,
                  prompt: int, decode: int, chunk: int) -> float:
    """Layer-blocks one request holds at prompt + decode tokens, over what one table for all layers holds."""
    m = KVCacheManager(10_000, block_size, local_window=window)
    r = req("a", [i % 100 for i in range(prompt)])
    while r.num_computed_tokens < prompt:
        step(m, r, min(chunk, prompt - r.num_computed_tokens))
    for t in range(decode):
        r.output_token_ids.append(t % 100)
        step(m, r, 1)
    g, loc = m.held_blocks("a")
    n_local = sum(w is not None for w in window_of)
    return ((num_layers - n_local) * g + n_local * loc) / (num_layers * g)


def test_gemma3_270m_at_8k_holds_under_30_percent() -> None:
    # gemma-3-270m: 18 layers, 15 local with window 512 (globals 5, 11, 17); block size 16, 2048-token chunks
    wins = [None if (i + 1) % 6 == 0 else 512 for i in range(18)]
    frac = held_fraction(18, wins, 512, 16, 8192 - 16, 16, 2048)
    assert frac <= 0.30, frac
    assert frac == pytest.approx((3 * 512 + 15 * 33) / (18 * 512), abs=0.01)


def test_split_blocks_keeps_the_memory() -> None:
    ng, nl = split_blocks(1000, 3, 15, 512, 16, 4, 2048)
    assert nl == 4 * 34 + 128 and 3 * ng + 15 * nl <= 18 * 1000 < 3 * (ng + 1) + 15 * nl
    assert split_blocks(100, 0, 4, 8, 4, 2, 16) == (100, 100)


_CACHE_BLOCKS = KVCacheManager.cache_blocks


def _run(path: Path, release: bool, monkeypatch: pytest.MonkeyPatch, **opts: object) -> tuple[list, list, int]:
    from hitenter import LLM, SamplingParams

    monkeypatch.setenv("HITENTER_WINDOW_RELEASE", "1" if release else "0")
    held: list[tuple[int, int, int]] = []
    def record(self: KVCacheManager, r: Request, n: int) -> None:
        _CACHE_BLOCKS(self, r, n)
        held.append((r.num_computed_tokens, *self.held_blocks(r.request_id)))

    monkeypatch.setattr(KVCacheManager, "cache_blocks", record)
    llm = LLM(str(path), block_size=4, **opts)
    try:
        rng = random.Random(1)
        base = [rng.randrange(5, 200) for _ in range(150)]
        prompts = [base, base[:120] + [7, 8, 9], [rng.randrange(5, 200) for _ in range(60)], base]
        sp = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
        outs.append(llm.generate([base], sp)[0].outputs[0].token_ids)   # a prefix hit on a finished request
        return outs, held, llm.engine.scheduler.stats.num_preemptions
    finally:
        llm.close()


@pytest.mark.slow
@pytest.mark.parametrize("quant,opts", [
    (None, {}),
    (None, {"kv_cache_memory": 1536 * 4 * 60, "max_model_len": 200, "max_num_batched_tokens": 64}),
    ("Q8_0", {"speculative_method": "ngram", "num_speculative_tokens": 3})])   # the fused C layers; n-gram drafts, most of them rejected
def test_engine_outputs_identical_with_and_without_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           quant: str | None, opts: dict) -> None:
    """Greedy, prefix caching, chunked prefill, (with the small cache) preemption and speculative verification
    rows: the same tokens as the one-table engine (release off), whose correctness tests/models/families/test_gemma3.py checks."""
    from hitenter.testing.tiny_gemma import write_tiny_gemma3

    # 6 layers, 5 local (window 8) and one global: Gemma 3's 5:1 pattern
    path = write_tiny_gemma3(tmp_path / "g.gguf", layers=6, pattern=6, context_length=512, quant=quant)
    off, held_off, pre_off = _run(path, False, monkeypatch, **opts)
    on, held_on, pre_on = _run(path, True, monkeypatch, **opts)
    assert on == off
    small = "kv_cache_memory" in opts
    assert (pre_off > 0 and pre_on > 0) == small, (pre_off, pre_on)   # the small cache preempts
    assert all(loc == 0 for _, _, loc in held_off)
    at, g, loc = max(held_on)                        # the longest context seen: 162 tokens
    assert loc <= 8 // 4 + 2 < g
    assert (1 * g + 5 * loc) / (6 * g) <= 0.30      # layer-blocks held vs one table for all layers


BS = 4


@torch.inference_mode()
def _model_logits(model: torch.nn.Module, ids: list[int], steps: list[tuple[int, int]], kernel_from: int,
                  decode_from: int | None, release: bool) -> torch.Tensor:
    """Logits of every step's rows; with `release` the local layers use their own caches and tables, whose
    entries outside the window are a placeholder (block 0, filled with garbage) and whose released blocks are
    overwritten with garbage, as when the pool hands them to another request."""
    cfg = model.config
    blocks = -(-len(ids) // BS)
    caches = allocate_kv_caches(cfg, blocks, BS, model.dtype, num_local_blocks=3 * blocks + 1 if release else None)
    ltable = [3 * i + 1 for i in range(blocks)]       # distinct local ids, none of them the placeholder 0
    g = torch.Generator().manual_seed(0)
    out = []
    for a, b in steps:
        meta = AttentionMetadata([0, b - a], [b], [list(range(blocks))], torch.arange(a, b), BS,
                                 kernel_from=[kernel_from], decode_from=None if decode_from is None else [decode_from])
        if release:
            dead = max(0, a - cfg.sliding_window + 1) // BS
            table = [PLACEHOLDER] * dead + ltable[dead:]
            for i, c in enumerate(caches):
                if cfg.layer_window(i) is not None:
                    for blk in [0, *ltable[:dead]]:
                        c[:, :, blk] = (torch.rand(c[:, :, blk].shape, generator=g) * 200 - 100).to(c.dtype)
            meta.local_block_tables = [table]
            meta.local_slot_mapping = torch.tensor([ltable[p // BS] * BS + p % BS for p in range(a, b)])
        out.append(model.compute_logits(model(torch.tensor(ids[a:b]), torch.arange(a, b), meta, caches)))
    return torch.cat(out)


@pytest.mark.slow
@pytest.mark.parametrize("per_layer,kernel_from,decode_from", [(False, 0, 31), (False, 31, None), (True, 0, 31)])
def test_model_bits_with_released_local_blocks(q8_gemma: Path, per_layer: bool, kernel_from: int,
                                               decode_from: int | None) -> None:
    """The torch layer, the decode and prompt kernels and the fused C layers (all layers in one call, or per
    layer as the trace runs them) give the one-table bits when the local layers read their own tables, whose
    entries outside the window hold garbage."""
    model, cfg = load_model(q8_gemma)
    ids = torch.randint(3, cfg.vocab_size, (44,), generator=torch.Generator().manual_seed(2)).tolist()
    steps = [(0, 20), (20, 32)] + [(p, p + 1) for p in range(32, 44)]
    all_fused = fused_decode.all_fused
    if per_layer:
        fused_decode.all_fused = lambda *a: None   # type: ignore[assignment]
    else:   # the tiny model's F32 head pads its rows, which keeps the all-layers call off: lifted for both runs
        model.dense_gemms = False
    try:
        one = _model_logits(model, ids, steps, kernel_from, decode_from, release=False)
        model.__dict__["_fused_arrays"] = None
        two = _model_logits(model, ids, steps, kernel_from, decode_from, release=True)
    finally:
        fused_decode.all_fused = all_fused
        model.__dict__["_fused_arrays"] = None
    assert all(isinstance(layer._fused, fused_decode.FusedLayer) for layer in model.layers)
    assert torch.equal(one, two)


@pytest.fixture(scope="module")
def q8_gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hitenter.testing.tiny_gemma import write_tiny_gemma3

    return write_tiny_gemma3(tmp_path_factory.mktemp("wrq") / "q8g.gguf", quant="Q8_0", seed=8)
