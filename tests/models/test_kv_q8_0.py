"""The q8_0 KV cache (`kv_cache_dtype q8_0`, llama.cpp's `--cache-type-k/v q8_0`; hitenter/models/kv_q8_0.py).

The quantizer is llama.cpp's (ggml-quants.c: quantize_row_q8_0_ref), checked on known values against that
formula written out here, and bit-equal to gguf-py's Q8_0 quantizer and to the native writers' (vec16.h).
Readers dequantize d * q exactly, so the kernels over a q8_0 cache compute what they compute over an fp32
cache holding the dequantized values (the prompt kernel and the GEMM path bitwise, the decode kernel within
its half copies' few ulp), and match the float64 torch reference on those values to the fp32 kernels' 1e-5.
Both the AVX2 build and the portable 16-lane build (compiled here with -mno-fma) are checked.
K rows are stored rotated (H k, the normalized Walsh-Hadamard transform) and the queries rotated to H q, V rows as
H_64 v (H_64 on each run of 64 values) and the output rotated back: over a q8_0 cache paged_attention(q) computes
H_64 of the fp32 attention of H q on the dequantized (rotated) keys and values."""

from __future__ import annotations

import ctypes
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from hitenter.llm import LLM
from hitenter.models import attention as A
from hitenter.models import decode_kernel as DK
from hitenter.models import fused_decode, kv_q8_0
from hitenter.models import prompt_kernel as PK
from hitenter.models.kv_dtype import Q8_0, cache_head_dim, row_width, value_bytes
from hitenter.models.loader import load_model
from hitenter.sampling_params import SamplingParams
from hitenter.testing.model_runs import logits_and_cache as _run_model
from hitenter.testing.tiny_model import write_tiny_gguf

BS = 16


def _llama_cpp_q8_0(x: np.ndarray) -> bytes:
    """ggml-quants.c's quantize_row_q8_0_ref, line by line (fp32 arithmetic, C's roundf)."""
    out = bytearray()
    for blk in x.astype(np.float32).reshape(-1, 32):
        amax = np.float32(0)
        for v in blk:
            amax = max(amax, np.float32(abs(v)))
        d = np.float32(amax / np.float32(127))
        inv = np.float32(1) / d if d else np.float32(0)
        out += np.float16(d).tobytes()
        for v in blk:
            x0 = np.float32(v * inv)
            out += int(math.floor(abs(x0) + 0.5) * (1 if x0 >= 0 else -1)).to_bytes(1, "little", signed=True)
    return bytes(out)


def _native_q8_0(x: torch.Tensor) -> bytes:
    lib = DK.load()
    x = x.float().contiguous()
    dst = torch.empty(x.numel() // 32 * 34, dtype=torch.uint8)
    assert lib.q8_0_quantize(x.data_ptr(), dst.data_ptr(), x.numel()) == 0
    return dst.numpy().tobytes()


# --- the codec --------------------------------------------------------------------------------------------

def test_quantizer_is_llama_cpps_on_known_values() -> None:
    # amax 127: d = 1 exactly, so x * id = x: halves round away from zero (C's roundf, not torch's ties-to-even)
    a = np.array([127, 2.5, -2.5, 0.5, -0.5, 1.5, 3.49, -126.5] + [0.0] * 24, dtype=np.float32)
    # d = 1.0001 is not an fp16: it is stored as 1.0, the q use the fp32 d (as llama.cpp)
    b = np.array([127.0127, 50.0, -63.5] + [1.0] * 29, dtype=np.float32)
    zeros = np.zeros(32, dtype=np.float32)                   # d = 0: id = 0, every q 0
    x = np.concatenate([a, b, zeros])
    got = kv_q8_0.quantize(torch.from_numpy(x)).numpy().tobytes()
    assert got == _llama_cpp_q8_0(x)
    q = np.frombuffer(got[2:34], dtype=np.int8)
    assert q[:8].tolist() == [127, 3, -3, 1, -1, 2, 3, -127]
    assert np.frombuffer(got[34:36], dtype=np.float16)[0] == 1.0
    assert got[68:] == bytes(34)
    assert torch.equal(kv_q8_0.dequantize(torch.frombuffer(bytearray(got[:34]), dtype=torch.uint8)),
                       torch.tensor([127.0, 3, -3, 1, -1, 2, 3, -127] + [0.0] * 24))


def test_quantizer_bit_equal_to_gguf_py_and_the_native_writer() -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(64, 128, generator=g) * s for s in (1e-3, 1.0, 30.0)])
    x[3, :32] = 0.0
    x[5, 7] = 1e4
    ours = kv_q8_0.quantize(x)
    ref = quantize(x.numpy(), GGMLQuantizationType.Q8_0)
    assert ours.shape == (192, 136) and ours.numpy().tobytes() == ref.tobytes()
    assert np.array_equal(kv_q8_0.dequantize(ours).numpy(), dequantize(ref, GGMLQuantizationType.Q8_0))
    if DK.load() is not None:
        assert _native_q8_0(x) == ref.tobytes()
    assert ours[:8].numpy().tobytes() == _llama_cpp_q8_0(x[:8].numpy())


def test_layout_bytes_and_refusal() -> None:
    assert row_width(Q8_0, 64) == 68 and row_width(Q8_0, 128) == 136 and row_width(Q8_0, 256) == 272
    assert value_bytes(Q8_0) == 34 / 32 and value_bytes(torch.float16) == 2
    with pytest.raises(ValueError, match="head_dim 80 is not a multiple of 32"):
        row_width(Q8_0, 80)
    with pytest.raises(ValueError, match="head_dim 96 is not a power of two"):
        row_width(Q8_0, 96)
    cache = A.allocate_kv_caches(_cfg(), 4, BS, Q8_0)[0]
    assert cache.shape == (2, 2, 4, BS, 68) and cache.dtype == torch.uint8 and cache_head_dim(cache) == 64


def _cfg():
    from hitenter.config import ModelConfig

    return ModelConfig("llama", 32, 128, 64, 2, 4, 2, 64, 1e4, 1e-5, 128, True)


def test_write_kv_stores_the_quantized_rows() -> None:
    cache = A.allocate_kv_caches(_cfg(), 4, BS, Q8_0)[0]
    k, v = torch.randn(5, 2, 64) * 10, torch.randn(5, 2, 64)
    slots = torch.tensor([3, 17, 18, 40, 63])
    A.write_kv(cache, k, v, slots)
    flat = cache.view(2, 2, -1, 68)
    assert torch.equal(flat[0][:, slots].transpose(0, 1), kv_q8_0.quantize(kv_q8_0.rotate(k)))
    assert torch.equal(flat[1][:, slots].transpose(0, 1), kv_q8_0.quantize(kv_q8_0.rotate_v(v)))


def _hadamard(d: int) -> torch.Tensor:
    """Sylvester's H_d / sqrt(d) in float64, written out (not the butterfly)."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


@pytest.mark.parametrize("d", [32, 64, 128, 256])
def test_rotation_is_the_orthonormal_hadamard_and_keeps_attention(d: int) -> None:
    h = _hadamard(d)
    assert torch.equal(h, h.T)                                            # symmetric
    torch.testing.assert_close(h @ h.T, torch.eye(d, dtype=torch.float64), rtol=0, atol=1e-12)   # orthonormal
    torch.testing.assert_close(kv_q8_0.rotate(torch.eye(d)).double(), h, rtol=0, atol=1e-7)     # the butterfly is H
    x = torch.randn(7, 3, d, generator=torch.Generator().manual_seed(d)) * 4
    torch.testing.assert_close(kv_q8_0.rotate(x).double(), x.double() @ h, rtol=0, atol=1e-5)
    torch.testing.assert_close(kv_q8_0.rotate(kv_q8_0.rotate(x)), x, rtol=0, atol=1e-5)   # its own inverse
    q, k, v = x[:4], x[3:], torch.randn(4, 3, d)
    plain = A.reference_attention(q, k, v, 0)
    torch.testing.assert_close(A.reference_attention(kv_q8_0.rotate(q), kv_q8_0.rotate(k), v, 0), plain,
                               rtol=1e-5, atol=1e-5)
    n = min(d, 64)   # V's rotation: H_n on each run of n values, its own inverse too
    hv = torch.block_diag(*[_hadamard(n)] * (d // n))
    torch.testing.assert_close(kv_q8_0.rotate_v(x).double(), x.double() @ hv, rtol=0, atol=1e-5)
    torch.testing.assert_close(kv_q8_0.rotate_v(kv_q8_0.rotate_v(x)), x, rtol=0, atol=1e-5)
    torch.testing.assert_close(kv_q8_0.rotate_v(A.reference_attention(q, k, kv_q8_0.rotate_v(v), 0)), plain,
                               rtol=1e-5, atol=1e-5)   # attention is linear in V: H_n undoes it on the output
    with pytest.raises(ValueError, match="not a power of two"):
        kv_q8_0.rotate(torch.zeros(2, 96))


@pytest.mark.skipif(DK.load() is None, reason="no C compiler")
def test_q8_0_cache_attention_is_the_unrotated_ones() -> None:
    """Through write_kv and paged_attention (the prompt kernel, the decode kernel, the GEMM path): the attention
    of the plain q on the keys and values the cache stands for, H dequantize(quantize(H k)) and
    H_64 dequantize(quantize(H_64 v)) (each its own inverse)."""
    n, h, kvh, d = 40, 4, 2, 64
    g = torch.Generator().manual_seed(2)
    k, v, q = torch.randn(n, kvh, d, generator=g) * 3, torch.randn(n, kvh, d, generator=g), torch.randn(n, h, d)
    keys = kv_q8_0.rotate(kv_q8_0.dequantize(kv_q8_0.quantize(kv_q8_0.rotate(k))))
    values = kv_q8_0.rotate_v(kv_q8_0.dequantize(kv_q8_0.quantize(kv_q8_0.rotate_v(v))))
    ref = A.reference_attention(q, keys, values, 0)
    table = list(range(-(-n // BS)))
    for kernel_from in (n, n - 1, None):
        cache = A.allocate_kv_caches(_cfg(), len(table), BS, Q8_0)[0]
        A.write_kv(cache, k, v, torch.arange(n))
        out = A.paged_attention(q, cache, _meta(n, n, table, kernel_from), 1 / math.sqrt(d))
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


# --- the kernels ------------------------------------------------------------------------------------------

def _q8_cache(kvh: int, d: int, length: int, seed: int = 0):
    """A random q8_0 cache, its block table, and the fp32 cache holding its dequantized values."""
    g = torch.Generator().manual_seed(seed)
    nb = -(-length // BS) + 3
    kv = kv_q8_0.quantize(torch.randn(2, kvh, nb, BS, d, generator=g) * 3)
    table = torch.randperm(nb, generator=g)[: -(-length // BS)].tolist()
    return kv, table, kv_q8_0.dequantize(kv)


def _keys(kv32: torch.Tensor, table: list[int], length: int):
    k = torch.stack([kv32[0, :, table[p // BS], p % BS] for p in range(length)])
    v = torch.stack([kv32[1, :, table[p // BS], p % BS] for p in range(length)])
    return k, v


def _meta(n: int, length: int, table: list[int], kernel_from: int | None) -> A.AttentionMetadata:
    return A.AttentionMetadata([0, n], [length], [table], torch.zeros(n, dtype=torch.long), BS,
                               kernel_from=None if kernel_from is None else [kernel_from],
                               use_kernel=None if kernel_from is None else True)


SHAPES = [(9, 3, 64, None), (12, 2, 128, 37), (4, 1, 256, None), (2, 2, 32, None)]


@pytest.mark.skipif(DK.load() is None, reason="no C compiler")
@pytest.mark.parametrize("h,kvh,d,window", SHAPES)
def test_decode_kernel_q8_0_cache(h: int, kvh: int, d: int, window: int | None) -> None:
    length = 203
    kv, table, kv32 = _q8_cache(kvh, d, length, seed=d)
    q = torch.randn(2, h, d, generator=torch.Generator().manual_seed(1))
    assert DK.supports(kv, h, torch.float32)
    meta = A.AttentionMetadata([0, 1, 2], [length, 150], [table, table], torch.zeros(2, dtype=torch.long), BS,
                               kernel_from=[length - 1, 149], use_kernel=True)
    out = A.paged_attention(q, kv, meta, 1 / math.sqrt(d), window=window)
    qr = kv_q8_0.rotate(q)   # what the q8_0 cache's keys (H k) meet; its values' output comes back through H_64
    meta32 = A.AttentionMetadata([0, 1, 2], [length, 150], [table, table], torch.zeros(2, dtype=torch.long), BS,
                                 kernel_from=[length - 1, 149], use_kernel=True)
    unrot = kv_q8_0.rotate_v
    torch.testing.assert_close(out, unrot(A.paged_attention(qr, kv32, meta32, 1 / math.sqrt(d), window=window)),
                               rtol=1e-6, atol=1e-6)
    k, v = _keys(kv32, table, length)
    for r, n in enumerate((length, 150)):
        ref = unrot(A.reference_attention(qr[r:r + 1], k[:n], v[:n], n - 1, 1 / math.sqrt(d), window=window))
        torch.testing.assert_close(out[r:r + 1], ref, rtol=1e-5, atol=1e-5)
    alone = A.paged_attention(q[1:], kv, _meta(1, 150, table, 149), 1 / math.sqrt(d), window=window)
    assert torch.equal(alone, out[1:])        # a row's bits depend on its own keys only


@pytest.mark.skipif(PK.load() is None, reason="no C compiler")
@pytest.mark.parametrize("h,kvh,d,window", SHAPES)
def test_prompt_kernel_q8_0_cache(h: int, kvh: int, d: int, window: int | None) -> None:
    n = 150
    kv, table, kv32 = _q8_cache(kvh, d, n, seed=d + 1)
    q = torch.randn(n, h, d, generator=torch.Generator().manual_seed(3))
    assert PK.supports(kv, h, torch.float32)
    out = A.paged_attention(q, kv, _meta(n, n, table, n), 1 / math.sqrt(d), window=window)
    q, unrot = kv_q8_0.rotate(q), kv_q8_0.rotate_v
    assert torch.equal(out, unrot(A.paged_attention(q, kv32, _meta(n, n, table, n), 1 / math.sqrt(d), window=window)))
    k, v = _keys(kv32, table, n)   # the fp32 kernel's own error vs float64: up to ~1.1e-5 at head_dim 256
    torch.testing.assert_close(out, unrot(A.reference_attention(q, k, v, 0, 1 / math.sqrt(d), window=window)),
                               rtol=1e-5, atol=2e-5)


def test_gemm_path_q8_0_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The torch path (no kernels): the gathered blocks dequantized, then the fp32 GEMM path's math."""
    monkeypatch.setattr(PK, "supports", lambda *a: False)
    n, h, kvh, d = 70, 6, 2, 64
    kv, table, kv32 = _q8_cache(kvh, d, n, seed=9)
    q = torch.randn(n, h, d, generator=torch.Generator().manual_seed(5))
    out = A.paged_attention(q, kv, _meta(n, n, table, None), 1 / math.sqrt(d))
    q, unrot = kv_q8_0.rotate(q), kv_q8_0.rotate_v
    assert torch.equal(out, unrot(A.paged_attention(q, kv32, _meta(n, n, table, None), 1 / math.sqrt(d))))
    k, v = _keys(kv32, table, n)
    torch.testing.assert_close(out, unrot(A.reference_attention(q, k, v, 0, 1 / math.sqrt(d))), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def portable() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """The decode and prompt kernels built without FMA: the portable 16-lane code instead of attn_avx2.h."""
    from hitenter.kernels.native import DECODE_ATTENTION, PROMPT_ATTENTION

    dlib, plib = DECODE_ATTENTION.instance("portable"), PROMPT_ATTENTION.instance("portable")
    if dlib is None or plib is None:
        pytest.skip("the attention kernels are not built here (no compiler, or switched off)")
    return dlib, plib


@pytest.mark.parametrize("h,kvh,d,window", SHAPES[:3])
def test_portable_kernels_q8_0_cache(portable, h: int, kvh: int, d: int, window: int | None) -> None:
    dlib, plib = portable
    n = 75
    kv, table, kv32 = _q8_cache(kvh, d, n, seed=d + 2)
    q = torch.randn(n, h, d, generator=torch.Generator().manual_seed(4))
    k, v = _keys(kv32, table, n)
    ref = A.reference_attention(q, k, v, 0, 1 / math.sqrt(d), window=window)
    t = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
    ctx, starts, flat = t(list(range(1, n + 1))), t([0] * n), t(table)
    nb = kv.shape[2]
    for cache, code in ((kv, 3), (kv32, 0)):
        out = torch.empty_like(q)
        assert dlib.decode_attention(q.data_ptr(), out.data_ptr(), cache.data_ptr(), code, n, ctx.data_ptr(),
                                     starts.data_ptr(), flat.data_ptr(), h, kvh, nb, BS, d, 1 / math.sqrt(d),
                                     window or 0, 1) == 0
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        pout = torch.empty_like(q)
        args = [t([0]), t([n]), t([0]), t([0]), flat]
        assert plib.prompt_attention(q.data_ptr(), pout.data_ptr(), cache.data_ptr(), code, 1,
                                     *(a.data_ptr() for a in args), h, kvh, nb, BS, d, 1 / math.sqrt(d),
                                     window or 0, 1) == 0   # fp32 vs float64: up to ~1.1e-5 at head_dim 256
        torch.testing.assert_close(pout, ref, rtol=1e-5, atol=2e-5)
        if code == 3:
            q8_out, q8_pout = out, pout
    torch.testing.assert_close(q8_out, out, rtol=1e-6, atol=1e-6)
    assert torch.equal(q8_pout, pout)


# --- the model and the engine -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """head_dim 32 (hidden 128, 4 heads, 2 KV heads), Q8_0 weights: the fused C layers run."""
    return write_tiny_gguf(tmp_path_factory.mktemp("kvq8") / "t.gguf", arch="llama", quant="Q8_0", seed=7,
                           hidden=128, heads=4, kv_heads=2, ffn=256)


def test_fused_layer_writes_and_reads_a_q8_0_cache(tiny: Path) -> None:
    """The fused C layer quantizes K/V as it writes them (to within a step of the torch path's values: the two
    compute K in another fp32 summation order) and its logits stay near the fp32-cache logits."""
    model, cfg = load_model(tiny)
    ids = torch.randint(3, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    for layer in model.layers:
        layer.__dict__.pop("_fused", None)
    q8, qc = _run_model(model, ids, 0, Q8_0)
    if fused_decode.DECODE_LAYER() is not None:   # the fused library (kernels/native.py) is built
        assert all(isinstance(layer._fused, fused_decode.FusedLayer) for layer in model.layers)
    full, fc = _run_model(model, ids, 0, torch.float32)
    for i, (a, b) in enumerate(zip(qc, fc, strict=True)):
        b = torch.stack([kv_q8_0.rotate(b[0]), kv_q8_0.rotate_v(b[1])])   # the q8_0 cache holds H k, H_64 v
        assert a.dtype == Q8_0
        got = kv_q8_0.dequantize(a)
        if i == 0:   # K/V from the embeddings alone: the writer's bytes are the torch quantizer's of the same values
            assert torch.equal(a, kv_q8_0.quantize(b))
            # each value within half a step d, plus |q| <= 127 times d's fp16 rounding (2^-11 relative)
            step = b.abs().view(*b.shape[:-1], -1, 32).amax(-1, keepdim=True) / 127
            assert bool(((got - b).abs().view(*b.shape[:-1], -1, 32) <= step * (0.5 + 127 * 2 ** -11) + 1e-6).all())
        else:        # later layers also see the earlier layers' attention over quantized keys
            torch.testing.assert_close(got, b, rtol=0, atol=float(b.abs().max()) * 2 ** -5)
    # a random tiny model: the mean logit moves 2.4% of the logits' spread (measured; real text: the perplexity test)
    assert float((q8 - full).abs().mean()) <= 0.05 * float(full.std())
    assert float((q8.argmax(-1) == full.argmax(-1)).float().mean()) >= 0.9
    for layer in model.layers:          # the torch layers on a q8_0 cache
        layer.__dict__["_fused"] = False
    torch_q8, _ = _run_model(model, ids, 0, Q8_0)
    assert float((q8 - torch_q8).abs().mean()) <= 0.02 * float(torch_q8.std())


def _sig(o) -> list[int]:
    return list(o.outputs[0].token_ids)


def test_engine_q8_0_end_to_end(tiny: Path) -> None:
    """The engine on a q8_0 cache: its bytes per token, greedy tokens identical alone and batched, from the
    prefix cache, after preemption (a budget of 9 blocks), with n-gram speculation; the playground's figures
    and the trace's logits are the engine's."""
    from hitenter.models.trace import trace_forward
    from hitenter.server.local_engine import model_info

    opts = dict(kv_cache_dtype="q8_0", max_model_len=128)
    llm = LLM(str(tiny), kv_cache_memory=1 << 20, **opts)
    parts = llm.engine.parts
    cfg = parts.model_config
    assert all(c.dtype == Q8_0 and c.shape[-1] == 34 for c in parts.runner.kv_caches)
    per = 2 * cfg.num_layers * cfg.num_kv_heads * 34
    assert parts.plan.kv_cache_dtype == "q8_0" and parts.plan.kv_bytes_per_token == per
    assert model_info(llm.engine).kv_bytes_per_token == per
    assert parts.num_blocks == (1 << 20) // (per * 16)
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [[5, 6, 7, 8, 9] * 6, [5, 6, 7, 8, 9] * 6 + [11, 12], [20, 21, 22], [30, 31] * 20]
    alone = [_sig(llm.generate([p], sp)[0]) for p in prompts]
    assert [_sig(o) for o in llm.generate(prompts, sp)] == alone
    warm = llm.generate([prompts[1]], sp)[0]
    assert warm.num_cached_tokens >= 16 and _sig(warm) == alone[1]
    tight = LLM(str(tiny), kv_cache_memory=per * 16 * 9, **opts)
    preempted: list[str] = []
    tight.engine.subscribe(lambda ev: preempted.extend(ev.preempted))
    assert [_sig(o) for o in tight.generate(prompts, sp)] == alone
    assert preempted, "the budget was meant to force preemption"
    ngram = LLM(str(tiny), kv_cache_memory=1 << 20, speculative_method="ngram", num_speculative_tokens=3, **opts)
    assert [_sig(o) for o in ngram.generate(prompts, sp)] == alone
    tr = trace_forward(parts.model, prompts[0])
    rid = llm.engine.add_request(None, prompts[0], SamplingParams(max_tokens=1))
    llm.engine.trace_requests.add(rid)
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    torch.testing.assert_close(tr.logits[-1], llm.engine.last_logits.pop(rid), atol=1e-3, rtol=0)


def test_q8_0_refused_where_head_dim_is_not_whole_blocks(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "d16.gguf", arch="llama", seed=1)      # head_dim 16
    with pytest.raises(ValueError, match="kv_cache_dtype q8_0: head_dim 16 is not a multiple of 32"):
        LLM(str(path), kv_cache_dtype="q8_0", kv_cache_memory=1 << 20, max_model_len=64)


@pytest.mark.slow
@pytest.mark.parametrize("opt", [{"tensor_parallel_size": 2}, {"disaggregate": "prefill=1,decode=1"}])
def test_q8_0_tensor_parallel_and_disaggregated_match_one_engine(tiny: Path, opt: dict) -> None:
    """Each rank quantizes its own KV heads' rows, the prefill worker ships the q8_0 blocks' bytes: the same
    tokens and logprobs as one engine, bitwise."""
    opts = dict(kv_cache_dtype="q8_0", kv_cache_memory=1 << 22, max_model_len=128, num_threads=1)
    sp = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=2)
    prompts = [[5, 6, 7, 8, 9] * 6, [20, 21, 22], list(range(3, 60))]

    def run(llm: LLM) -> list[tuple[list[int], list[float]]]:
        return [(_sig(o), [p.chosen.logprob for p in o.outputs[0].logprobs]) for o in llm.generate(prompts, sp)]

    with LLM(str(tiny), **opts) as one:
        ref = run(one)
    with LLM(str(tiny), **opts, **opt) as two:
        assert run(two) == ref
