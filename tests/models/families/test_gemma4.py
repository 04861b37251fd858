"""Gemma 4 (models/gemma4.py, families/gemma4.py) beyond the llama.cpp goldens of the tiny gemma4 and gemma4_moe
files (test_llama_cpp_logits.py, test_family_prefix_hits.py, test_q8_0_goldens.py): the per-layer cache shapes
and KV sharing, the per-layer token table left on the file's map, the refusals, and batch / chunk /
prefix-cache invariance (dense and mixture of experts)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import gguf
import pytest
import torch

from hitenter import LLM, SamplingParams
from hitenter.errors import ModelLoadError
from hitenter.kernels.blocks import BlockWeight
from hitenter.models.attention import allocate_kv_caches
from hitenter.models.families import family_for
from hitenter.models.gguf import dequantize, open_gguf, read_gguf_metadata
from hitenter.models.loader import load_model
from hitenter.models.mapped_rows import MappedRows
from hitenter.testing.model_runs import Runner
from hitenter.testing.tiny_families import GEMMA4, write_tiny_family


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_family(tmp_path_factory.mktemp("gemma4") / "gemma4.gguf", "gemma4")


@pytest.fixture(scope="module")
def q8_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_family(tmp_path_factory.mktemp("gemma4") / "gemma4-q8_0.gguf", "gemma4", quant="Q8_0")


def _meta(path: Path) -> tuple[dict, set[str]]:
    reader = open_gguf(path)
    return read_gguf_metadata(reader), {t.name for t in reader.tensors}


def test_per_layer_shapes_and_shared_kv_in_the_cache(tiny_path: Path) -> None:
    cfg = load_model(tiny_path, dtype="float32")[1]
    swa = GEMMA4["swa"]
    assert [cfg.layer_window(i) is not None for i in range(cfg.num_layers)] == swa
    assert [cfg.layer_kv_source(i) for i in range(cfg.num_layers)] == [0, 1, 2, 3, 2, 3]
    caches = allocate_kv_caches(cfg, 5, 16, num_local_blocks=3)
    for i, c in enumerate(caches):
        kvh, d = (GEMMA4["kv_swa"], GEMMA4["head_swa"]) if swa[i] else (GEMMA4["kv_full"], GEMMA4["head_full"])
        assert tuple(c.shape) == (2, kvh, 3 if swa[i] else 5, 16, d), i
    assert caches[4] is caches[2] and caches[5] is caches[3]   # the shared layers hold no tensor of their own
    assert len({id(c) for c in caches}) == 4
    own = sum(GEMMA4["kv_swa"] * GEMMA4["head_swa"] if s else GEMMA4["kv_full"] * GEMMA4["head_full"]
              for s in swa[:4])
    assert cfg.kv_bytes_per_token(4) == 2 * 4 * own


@pytest.mark.parametrize("dtype", ["auto", "float32"])
def test_per_layer_token_table_is_looked_up_by_rows_on_the_map(dtype: str, q8_path: Path) -> None:
    """The table (Q8_0 blocks here) stays a view of the file in every format: not a parameter or buffer,
    not in the weight arena, and its rows are the file's rows."""
    model = load_model(q8_path, dtype=dtype)[0]
    table = model.ple_table.table
    assert isinstance(model.ple_table, MappedRows) and isinstance(table, BlockWeight)
    held = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())
            if t.device.type == "cpu" and t.layout == torch.strided and not t.is_mkldnn}
    assert table.data.untyped_storage().data_ptr() not in held
    reader = open_gguf(q8_path)
    t = next(t for t in reader.tensors if t.name == "per_layer_token_embd.weight")
    want = torch.from_numpy(dequantize(t.data, t.tensor_type).reshape(table.shape).astype("float32"))
    ids = torch.tensor([[5, 300], [5, 7]])
    assert torch.equal(model.ple_table(ids), want[ids])


def _big_vocab(w: gguf.GGUFWriter) -> int:
    """A 30000-token vocabulary (its texts never tokenized here): a per-layer table of 30000 rows."""
    n = 30000
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([f"t{i}" for i in range(n)])
    w.add_token_types([1] * n)
    w.add_token_merges([])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    return n


@pytest.mark.slow
def test_resident_memory_excludes_the_per_layer_table(tmp_path: Path) -> None:
    """A gemma4 file whose per-layer token table (30000 tokens x 6 layers x 64, F32) is 46 MB, its other
    weights ~17 MB: a second load of it plus a step (the first pays the process's one-time costs) adds the
    other weights and under half the table to the resident memory, in the default format and in
    float32 (a resident table would add all of it)."""
    import hitenter.testing.tiny_families as tiny

    wide = {**tiny.GEMMA4, "per_layer": 64}
    old, tiny.GEMMA4 = tiny.GEMMA4, wide
    try:
        path = write_tiny_family(tmp_path / "wide.gguf", "gemma4", tokenizer=_big_vocab)
    finally:
        tiny.GEMMA4 = old
    table_bytes = 30000 * 64 * len(wide["swa"]) * 4
    for dtype in ("auto", "float32"):
        warm = load_model(path, dtype=dtype)[0]   # the process's one-time costs (libraries, workspaces) first
        with torch.no_grad():
            Runner(warm, 1, 8).step({0: [3, 4, 5, 6, 7, 8, 9, 10]})
        before = _rss()
        model = load_model(path, dtype=dtype)[0]
        with torch.no_grad():
            Runner(model, 1, 8).step({0: [3, 4, 5, 6, 7, 8, 9, 10]})
        grown = _rss() - before
        print(f"{dtype}: resident +{grown / 1e6:.1f} MB for a {table_bytes / 1e6:.1f} MB table, "
              f"{model.weight_bytes() / 1e6:.1f} MB of other weights")
        assert grown < model.weight_bytes() + table_bytes / 2, (dtype, grown, table_bytes)
        del model, warm


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_missing_pattern_shared_kv_without_sources_and_rope_scaling_are_refused(tiny_path: Path) -> None:
    meta, names = _meta(tiny_path)
    with pytest.raises(ModelLoadError, match="RoPE scaling"):
        family_for("gemma4").config({**meta, "gemma4.rope.scaling.type": "linear"}, names)
    meta2 = {k: v for k, v in meta.items() if k != "gemma4.attention.sliding_window_pattern"}
    with pytest.raises(ModelLoadError, match="sliding_window_pattern"):
        family_for("gemma4").config(meta2, names)
    meta3 = {**meta, "gemma4.attention.sliding_window_pattern": [True] * 6}
    with pytest.raises(ModelLoadError, match="KV-shared"):
        family_for("gemma4").config(meta3, names)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gemma4", "gemma4_moe"])
@pytest.mark.parametrize("fmt", ["float32", "q8_0"])
def test_chunked_and_batched_rows_keep_the_lone_runs_bits(family: str, fmt: str, tmp_path: Path) -> None:
    path = write_tiny_family(tmp_path / f"{family}.gguf", family, quant=None if fmt == "float32" else "Q8_0")
    model = load_model(path, dtype="float32")[0] if fmt == "float32" else load_model(path)[0]
    rng = random.Random(0)
    seqs = [[rng.randrange(3, 300) for _ in range(n)] for n in (45, 7, 30)]
    with torch.no_grad():
        alone = [Runner(model, 1, len(s)).step({0: s})[0] for s in seqs]
        r = Runner(model, 3, 45)
        parts: list[list[torch.Tensor]] = [[], [], []]
        for cut in ((0, 9), (9, 26), (26, 45)):
            feed = {i: s[cut[0]:cut[1]] for i, s in enumerate(seqs) if s[cut[0]:cut[1]]}
            for i, lg in r.step(feed).items():
                parts[i].append(lg)
    for i in range(len(seqs)):
        assert torch.equal(torch.cat(parts[i]), alone[i]), i


@pytest.fixture(scope="module")
def fused_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny gemma4 with per-layer inputs of 32 (one Q8_0 block): every layer's projections native
    blocks, so its rows run the fused C layer (the golden file's 16 keep the per-layer projection dense)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(GEMMA4, "per_layer", 32)
        return write_tiny_family(tmp_path_factory.mktemp("gemma4") / "gemma4-fused.gguf", "gemma4", quant="Q8_0")


@pytest.mark.slow
@pytest.mark.parametrize("which", ["torch layers", "fused layers"])
def test_engine_batches_chunks_and_prefix_hits_give_the_lone_runs_tokens(which: str, q8_path: Path,
                                                                          fused_path: Path) -> None:
    path = fused_path if which == "fused layers" else q8_path
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(3, 60))] for _ in range(6)]
    prompts[0] = [rng.randrange(3, 300) for _ in range(50)]
    prompts[1] = prompts[0][:40] + [5, 6, 7]   # a prefix-cache hit of two blocks past every window
    sp = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=2)

    def sig(o):  # noqa: ANN001, ANN202
        return o.outputs[0].token_ids, [(p.chosen.token_id, p.chosen.logprob) for p in o.outputs[0].logprobs]

    llm = LLM(str(path), max_num_batched_tokens=256)
    fused = llm.engine.parts.runner.plan.fused_prompt_max > 0
    assert fused == (which == "fused layers"), llm.engine.parts.runner.plan.describe()
    alone = [sig(llm.generate([p], sp)[0]) for p in prompts]
    assert [sig(o) for o in llm.generate(prompts, sp)] == alone
    warm = llm.generate([prompts[1]], sp)[0]
    assert warm.num_cached_tokens >= 32 and sig(warm) == alone[1]
    chunked = LLM(str(path), max_num_batched_tokens=16, enable_prefix_caching=False)
    assert [sig(o) for o in chunked.generate(prompts, sp)] == alone


def test_the_playground_trace_declines_gemma4(tiny_path: Path) -> None:
    """The trace runs decoder layers; Gemma 4's take per-layer inputs: not traceable (a 400 in the playground)."""
    from hitenter.models.trace import traceable

    assert not traceable(load_model(tiny_path, dtype="float32")[0])


def test_layers_the_decode_kernel_cannot_take_run_on_the_gemm_path(q8_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's plan checks the first layer's cache; a Gemma 4 global layer's wider heads (were they
    past the kernel's limit, 512; here 32 past a lowered limit of 16) take the GEMM path instead of failing."""
    from hitenter.models import decode_kernel

    if decode_kernel.load() is None:
        pytest.skip("the decode kernel is not built here")
    monkeypatch.setattr(decode_kernel, "MAX_HEAD_DIM", 16)
    llm = LLM(str(q8_path), max_num_batched_tokens=64)
    out = llm.generate([list(range(3, 40))], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 6
    assert llm.engine.parts.runner.plan.attention_kernel   # the kernel ran for the local layers


def test_the_kv_cache_fits_its_budget_with_per_layer_shapes(q8_path: Path) -> None:
    """kv_cache_memory bounds the cache tensors' bytes: the global and local groups' pools are sized by what
    each group's layers take per block (per-layer head sizes and KV heads; shared layers take nothing)."""
    budget = 4 << 20
    llm = LLM(str(q8_path), kv_cache_memory=budget, kv_cache_dtype="float32", max_model_len=256, max_num_seqs=2)
    caches = {id(c): c for c in llm.engine.parts.runner.kv_caches}
    used = sum(c.nbytes for c in caches.values())
    assert llm.engine.kv_manager.local is not None   # the local layers have their own tables
    assert 0.95 * budget <= used <= budget, (used, budget)   # (by layer counts: 0.88, shared layers counted)


@pytest.mark.slow
def test_preemption_recomputes_the_same_tokens(q8_path: Path) -> None:
    """A KV budget of a few blocks per group: requests are preempted and recomputed, with the tokens and
    logprobs of a run that had room (shared-KV layers included, both groups released and refilled)."""
    rng = random.Random(4)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(20, 60))] for _ in range(6)]
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)

    def sig(o):  # noqa: ANN001, ANN202
        return o.outputs[0].token_ids, [(p.chosen.token_id, p.chosen.logprob) for p in o.outputs[0].logprobs]

    ref = [sig(o) for o in LLM(str(q8_path), enable_prefix_caching=False).generate(prompts, sp)]
    cfg = load_model(q8_path)[1]
    per_block = cfg.kv_bytes_per_token(2) * 16   # the default half-precision cache
    small = LLM(str(q8_path), enable_prefix_caching=False, max_model_len=128, max_num_seqs=6,
                kv_cache_memory=12 * per_block)
    assert [sig(o) for o in small.generate(prompts, sp)] == ref
    assert small.engine.scheduler.stats.num_preemptions > 0
