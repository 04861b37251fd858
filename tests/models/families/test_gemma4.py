"""Gemma 4 (models/gemma4.py, families/gemma4.py) beyond the llama.cpp goldens of the tiny gemma4 and gemma4_moe
files (test_llama_cpp_logits.py, test_family_prefix_hits.py, test_q8_0_goldens.py): the per-layer cache shapes
and KV sharing, the per-layer token table left on the file's map, the refusals, and batch / chunk /
prefix-cache invariance (dense and mixture of experts)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from hitenter import LLM, SamplingParams
from hitenter.errors import ModelLoadError
from hitenter.models.attention import allocate_kv_caches
from hitenter.models.block_linear import BlockEmbedding
from hitenter.models.families import family_for
from hitenter.models.gguf import open_gguf, read_gguf_metadata
from hitenter.models.loader import load_model
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


def test_per_layer_token_table_is_looked_up_by_rows_on_the_map(q8_path: Path) -> None:
    model = load_model(q8_path)[0]
    assert isinstance(model.ple_table, BlockEmbedding)
    arena = model.__dict__.get("weight_arena")
    table = model.ple_table.table.data
    # the projections were copied into the weight arena; the table was left where the loader mapped it
    assert arena is not None and all(table.data_ptr() != p.data.data_ptr()
                                     for m in model.modules() for p in getattr(m, "parts", []))


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


@pytest.mark.slow
def test_engine_batches_chunks_and_prefix_hits_give_the_lone_runs_tokens(q8_path: Path) -> None:
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(3, 60))] for _ in range(6)]
    prompts[0] = [rng.randrange(3, 300) for _ in range(50)]
    prompts[1] = prompts[0][:40] + [5, 6, 7]   # a prefix-cache hit of two blocks past every window
    sp = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=2)

    def sig(o):  # noqa: ANN001, ANN202
        return o.outputs[0].token_ids, [(p.chosen.token_id, p.chosen.logprob) for p in o.outputs[0].logprobs]

    llm = LLM(str(q8_path), max_num_batched_tokens=256)
    alone = [sig(llm.generate([p], sp)[0]) for p in prompts]
    assert [sig(o) for o in llm.generate(prompts, sp)] == alone
    warm = llm.generate([prompts[1]], sp)[0]
    assert warm.num_cached_tokens >= 32 and sig(warm) == alone[1]
    chunked = LLM(str(q8_path), max_num_batched_tokens=16, enable_prefix_caching=False)
    assert [sig(o) for o in chunked.generate(prompts, sp)] == alone
