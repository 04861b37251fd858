"""The KV cache in half precision (`kv_cache_dtype`, hitenter/models/kv_dtype.py).

The kernels widen each cache element exactly to fp32 as they load it, so over an f16 / bf16 cache they give
what they give over an fp32 cache holding the same rounded values (bitwise for the prompt kernel and the
GEMM path; within a few ulp for the decode kernel, whose half copies differ in FMA contraction); against the float64 torch reference on those rounded values the tolerance is the fp32
kernels' own (1e-5: fp32 accumulation over a few hundred keys, no half-precision arithmetic anywhere).
The rounding itself is torch's (round to nearest even): write_kv and the fused layer store what
`.to(dtype)` gives."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hitenter.config import CacheConfig, EngineConfig
from hitenter.kernels.native import DECODE_LAYER
from hitenter.llm import LLM
from hitenter.models import attention as A
from hitenter.models import decode_kernel as DK
from hitenter.models import fused_decode
from hitenter.models import prompt_kernel as PK
from hitenter.models.kv_dtype import auto_half, resolve_kv_dtype
from hitenter.models.loader import load_model
from hitenter.sampling_params import SamplingParams
from hitenter.testing.model_runs import logits_and_cache as _run_model
from hitenter.testing.tiny_model import write_tiny_gguf

BS = 16
HALVES = [torch.float16, torch.bfloat16]


def _cache(kvh: int, d: int, length: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    nb = -(-length // BS) + 3
    kv = (torch.randn(2, kvh, nb, BS, d, generator=g) * 3).to(dtype)
    table = torch.randperm(nb, generator=g)[: -(-length // BS)].tolist()
    return kv, table


def _keys(kv: torch.Tensor, table: list[int], length: int):
    k = torch.stack([kv[0, :, table[p // BS], p % BS] for p in range(length)]).float()
    v = torch.stack([kv[1, :, table[p // BS], p % BS] for p in range(length)]).float()
    return k, v


def _meta(n: int, length: int, table: list[int], kernel_from: int | None) -> A.AttentionMetadata:
    return A.AttentionMetadata([0, n], [length], [table], torch.zeros(n, dtype=torch.long), BS,
                               kernel_from=None if kernel_from is None else [kernel_from],
                               use_kernel=None if kernel_from is None else True)


# --- the option -------------------------------------------------------------------------------------------

def test_option_validated_and_resolved() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        CacheConfig(kv_cache_dtype="float8")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig.from_options(kv_cache_dtype="int4")
    assert CacheConfig(kv_cache_dtype="fp16").kv_cache_dtype == "float16"
    assert EngineConfig.from_options(kv_cache_dtype="bfloat16").cache.kv_cache_dtype == "bfloat16"
    assert CacheConfig().kv_cache_dtype == "auto"
    # auto: half precision for the GGUF's blocks; the fp32 reference stays fp32, dense bf16 weights keep bf16
    assert resolve_kv_dtype("auto", torch.float32, "float32") == torch.float32
    assert resolve_kv_dtype("auto", torch.bfloat16, "bfloat16") == torch.bfloat16
    assert resolve_kv_dtype("auto", torch.float32, "auto") == auto_half()
    assert auto_half() in (torch.float16, torch.bfloat16)
    assert resolve_kv_dtype("float32", torch.float32, "auto") == torch.float32
    assert resolve_kv_dtype("float16", torch.bfloat16, "bfloat16") == torch.float16


def test_cli_has_the_flag() -> None:
    from hitenter.config import option_fields

    assert "kv_cache_dtype" in {f.name for _, f in option_fields()}


# --- the kernels ------------------------------------------------------------------------------------------

@pytest.mark.skipif(DK.load() is None, reason="no C compiler")
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("h,kvh,d,window", [(9, 3, 64, None), (12, 2, 128, 37), (4, 4, 16, None)])
def test_decode_kernel_half_cache(dtype: torch.dtype, h: int, kvh: int, d: int, window: int | None) -> None:
    length = 203
    kv, table = _cache(kvh, d, length, dtype, seed=d)
    q = torch.randn(1, h, d, generator=torch.Generator().manual_seed(1))
    meta = _meta(1, length, table, length - 1)
    assert DK.supports(kv, h, torch.float32)
    out = A.paged_attention(q, kv, meta, 1 / math.sqrt(d), window=window)
    out32 = A.paged_attention(q, kv.float(), _meta(1, length, table, length - 1), 1 / math.sqrt(d), window=window)
    # exact widening, the fp32 kernel's arithmetic; for head sizes 64 / 128 the half copies are compiled
    # with the type a constant, where GCC contracts some multiply-adds into FMAs: a few ulp, not more
    torch.testing.assert_close(out, out32, rtol=1e-6, atol=1e-6)
    k, v = _keys(kv, table, length)
    ref = A.reference_attention(q, k, v, length - 1, 1 / math.sqrt(d), window=window)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(DK.load() is None, reason="no C compiler")
def test_decode_kernel_half_queries_on_f16_cache() -> None:
    """bf16 / f16 queries (a dense half model) over an f16 cache: the output in the query dtype."""
    kv, table = _cache(2, 64, 50, torch.float16, seed=4)
    q = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(2))
    k, v = _keys(kv, table, 50)
    for qd in (torch.bfloat16, torch.float16):
        out = A.paged_attention(q.to(qd), kv, _meta(1, 50, table, 49), 0.125)
        assert out.dtype == qd
        ref = A.reference_attention(q.to(qd).float(), k, v, 49, 0.125)
        torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)   # the output rounded to 8 / 11 bits


@pytest.mark.skipif(PK.load() is None, reason="no C compiler")
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("h,kvh,d,window", [(9, 3, 64, None), (12, 2, 128, 37), (2, 2, 16, None)])
def test_prompt_kernel_half_cache(dtype: torch.dtype, h: int, kvh: int, d: int, window: int | None) -> None:
    n = 150
    kv, table = _cache(kvh, d, n, dtype, seed=d + 1)
    q = torch.randn(n, h, d, generator=torch.Generator().manual_seed(3))
    assert PK.supports(kv, h, torch.float32)
    out = A.paged_attention(q, kv, _meta(n, n, table, n), 1 / math.sqrt(d), window=window)
    out32 = A.paged_attention(q, kv.float(), _meta(n, n, table, n), 1 / math.sqrt(d), window=window)
    assert torch.equal(out, out32)
    k, v = _keys(kv, table, n)
    ref = A.reference_attention(q, k, v, 0, 1 / math.sqrt(d), window=window)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", HALVES)
def test_gemm_path_half_cache(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """The torch GEMM path (no kernels): gathered blocks widened to fp32 before the GEMMs."""
    monkeypatch.setattr(PK, "supports", lambda *a: False)
    n, h, kvh, d = 70, 6, 2, 32
    kv, table = _cache(kvh, d, n, dtype, seed=9)
    q = torch.randn(n, h, d, generator=torch.Generator().manual_seed(5))
    out = A.paged_attention(q, kv, _meta(n, n, table, None), 1 / math.sqrt(d))
    assert torch.equal(out, A.paged_attention(q, kv.float(), _meta(n, n, table, None), 1 / math.sqrt(d)))
    k, v = _keys(kv, table, n)
    torch.testing.assert_close(out, A.reference_attention(q, k, v, 0, 1 / math.sqrt(d)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", HALVES)
def test_write_kv_rounds_like_torch(dtype: torch.dtype) -> None:
    cache = A.allocate_kv_caches(_tiny_cfg(), 4, BS, dtype)[0]
    k, v = torch.randn(5, 2, 16) * 10, torch.randn(5, 2, 16)
    slots = torch.tensor([3, 17, 18, 40, 63])
    A.write_kv(cache, k, v, slots)
    flat = cache.view(2, 2, -1, 16)
    assert torch.equal(flat[0][:, slots].transpose(0, 1), k.to(dtype))
    assert torch.equal(flat[1][:, slots].transpose(0, 1), v.to(dtype))


def _tiny_cfg():
    from hitenter.config import ModelConfig

    return ModelConfig("llama", 32, 32, 64, 2, 4, 2, 16, 1e4, 1e-5, 128, True)


# --- the model and the engine -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("kvd") / "t.gguf", arch="llama", quant="Q8_0", seed=7)


@pytest.mark.parametrize("dtype", HALVES)
def test_fused_layer_writes_and_reads_a_half_cache(tiny: Path, dtype: torch.dtype) -> None:
    """The fused native layer on an f16 / bf16 cache: it runs fused, stores K/V rounded to the cache type
    (the torch layer's values to that rounding: the K the two paths compute differ by fp32 summation order
    only), and its logits stay as close to the fp32-cache logits as the fused-vs-torch comparison allows."""
    model, cfg = load_model(tiny)
    ids = torch.randint(3, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    for layer in model.layers:
        layer.__dict__.pop("_fused", None)
    half, hc = _run_model(model, ids, 0, dtype)
    if DECODE_LAYER() is not None:
        assert all(isinstance(layer._fused, fused_decode.FusedLayer) for layer in model.layers)
    full, fc = _run_model(model, ids, 0, torch.float32)
    for a, b in zip(hc, fc, strict=True):
        assert a.dtype == dtype
        torch.testing.assert_close(a.float(), b.to(dtype).float(), rtol=0, atol=float(b.abs().max()) * 2 ** -6)
    diff = (half - full).abs()
    assert float(diff.mean()) <= 0.02 * float(full.std())
    assert float((half.argmax(-1) == full.argmax(-1)).float().mean()) >= 0.9
    for layer in model.layers:          # the torch layers on the same half cache type
        layer.__dict__["_fused"] = False
    torch_half, _ = _run_model(model, ids, 0, dtype)
    assert float((half - torch_half).abs().mean()) <= 0.02 * float(torch_half.std())


@pytest.mark.parametrize("kvd", ["float32", "float16", "bfloat16"])
def test_engine_end_to_end(tiny: Path, kvd: str) -> None:
    """Each cache type through the engine: greedy tokens identical alone and batched (batch invariance),
    with a shared prefix served from the prefix cache, and the bytes per token of the type."""
    llm = LLM(str(tiny), kv_cache_dtype=kvd, kv_cache_memory=1 << 20, max_model_len=128)
    parts = llm.engine.parts
    assert all(c.dtype == getattr(torch, kvd) for c in parts.runner.kv_caches)
    assert parts.plan.kv_cache_dtype == kvd
    per = parts.model_config.kv_bytes_per_token(4 if kvd == "float32" else 2)
    assert parts.plan.kv_bytes_per_token == per
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompts = [[5, 6, 7, 8, 9] * 4, [5, 6, 7, 8, 9] * 4 + [11, 12], [20, 21, 22]]
    alone = [llm.generate([p], sp)[0].outputs[0].token_ids for p in prompts]
    batched = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    assert batched == alone
    assert all(len(t) == 12 for t in alone)


def test_half_cache_halves_bytes_and_doubles_blocks(tiny: Path) -> None:
    blocks = {}
    for kvd in ("float32", "float16"):
        llm = LLM(str(tiny), kv_cache_dtype=kvd, kv_cache_memory=1 << 20, max_model_len=128)
        blocks[kvd] = (llm.engine.parts.num_blocks, llm.engine.parts.plan.kv_bytes_per_token)
    assert blocks["float16"][1] * 2 == blocks["float32"][1]
    assert blocks["float16"][0] == 2 * blocks["float32"][0]


def test_auto_defaults(tiny: Path) -> None:
    """auto: half precision for GGUF blocks (the default weights: half the bytes per token), fp32 for the
    fp32 reference."""
    gguf = LLM(str(tiny), kv_cache_memory=1 << 20, max_model_len=128)
    assert gguf.engine.parts.runner.kv_caches[0].dtype == auto_half()
    assert gguf.engine.plan.kv_bytes_per_token * 2 == gguf.engine.parts.model.config.kv_bytes_per_token(4)
    ref = LLM(str(tiny), dtype="float32", kv_cache_memory=1 << 20, max_model_len=128)
    assert ref.engine.parts.runner.kv_caches[0].dtype == torch.float32
